"""Tests of mgtrace.serialization, one file per module of the package (a
package, so that helpers import relatively and names stay distinct)."""
