cdef class Device:
    cdef readonly str type
    cdef readonly int index
    cdef readonly int _id

cdef list DEVICES
cdef int default_device_id
cdef Device device_of(object spec)
cdef int device_id(object spec) except -1
