"""Packed documents (data.pack, zoo/attention/documents.py): a packed row equals its documents run one by one.

Over every registered mechanism, by its flags: a model built on it either takes packed rows and gives, for
every document, the outputs (and the loss) the document gives alone, or refuses packing up front with the
reason. A mechanism that accepted packing and let a token see another document fails the equality (checked
here by breaking vanilla's document mask on purpose). The default run keeps one case per family of kernels
(dense SDPA, the scalar and the diagonal decay kernels, the classifier head, the reversible stack); the other
accepting mechanisms and options run with the slow tests.
"""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.attention import document_attention
from zoo.attention.base import ATTENTION
from zoo.attention.documents import positions_in_documents, segment_ids
from zoo.attention.kernelized import causal_kernel_attention
from zoo.attention.vanilla import VanillaAttention
from zoo.config import IGNORE_INDEX

NAMES = zoo.list_attention()
VOCAB = 24
LENGTHS = ((5, 11, 3), (17, 1, 9))  # two rows; documents cross chunk and block edges; one of a single token
ROW = 20  # row length: the first row ends in padding, the second is cut to fit (its last document is 2 long)
# the default run's equality cases, one per kernel family and head (chosen for cost only, never for capability)
FAST = {
    ("vanilla", "lm"),
    ("vanilla", "classifier"),
    ("retention", "lm"),
    ("gla", "lm"),
    ("linear", "lm"),
    ("gated_deltanet", "lm"),
}


def model(kind: str, attention: dict, **extra) -> zoo.ZooModel:
    preset = "vanilla_lm" if kind == "lm" else "vanilla_classifier"
    sizes = {"vocab_size": VOCAB, "d_model": 32, "n_heads": 4, "d_ff": 48, "n_layers": 2, "max_len": 64}
    if kind == "classifier":
        sizes["n_classes"] = 3
    return zoo.create_model(preset, attention=attention, dropout=0.0, **sizes, **extra).double().eval()


def packed_rows(seed: int = 0) -> tuple[list[list[torch.Tensor]], dict[str, torch.Tensor]]:
    """Documents (token ids, one list per row, the second row's last cut to fit) and their packed batch."""
    generator = torch.Generator().manual_seed(seed)
    rows, tokens, documents, pad_mask = [], [], [], []
    for lengths in LENGTHS:
        docs, left = [], ROW
        for n in lengths:
            if left:
                docs.append(torch.randint(1, VOCAB, (min(n, left),), generator=generator))
                left -= len(docs[-1])
        ids = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])
        tokens.append(torch.cat([torch.cat(docs), torch.zeros(left, dtype=torch.long)]))
        documents.append(torch.cat([ids, torch.full((left,), len(docs))]))
        pad_mask.append(torch.arange(ROW) < ROW - left)
        rows.append(docs)
    batch = {"tokens": torch.stack(tokens), "documents": torch.stack(documents), "pad_mask": torch.stack(pad_mask)}
    return rows, batch


def lm_targets(rows: list[list[torch.Tensor]], seed: int = 1) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    """A next-token target per document position, cut per document (the packed loader's rule): each
    document's last position predicts a token of its own, never the next document's first."""
    generator = torch.Generator().manual_seed(seed)
    per_doc = [[torch.randint(0, VOCAB, (len(d),), generator=generator) for d in docs] for docs in rows]
    packed = torch.full((len(rows), ROW), IGNORE_INDEX)
    for r, targets in enumerate(per_doc):
        flat = torch.cat(targets)
        packed[r, : len(flat)] = flat
    return per_doc, packed


def assert_packed_equals_alone(m: zoo.ZooModel, kind: str) -> None:
    rows, batch = packed_rows()
    with torch.no_grad():
        if kind == "lm":
            per_doc, targets = lm_targets(rows)
            out = m(batch["tokens"], targets, pad_mask=batch["pad_mask"], documents=batch["documents"])
            alone = [m(d[None], t[None]) for docs, ts in zip(rows, per_doc) for d, t in zip(docs, ts)]
            real = batch["pad_mask"]
            torch.testing.assert_close(out.logits[real], torch.cat([a.logits[0] for a in alone]))
            counts = torch.tensor([len(d) for docs in rows for d in docs], dtype=torch.float64)
            mean = (torch.stack([a.loss for a in alone]) * counts).sum() / counts.sum()
            torch.testing.assert_close(out.loss.double(), mean, rtol=1e-6, atol=1e-6)  # the loss is float32
        else:
            labels = torch.arange(sum(len(docs) for docs in rows)) % 3
            out = m(batch["tokens"], labels, pad_mask=batch["pad_mask"], documents=batch["documents"])
            alone = torch.cat([m(d[None]).logits for docs in rows for d in docs])
            torch.testing.assert_close(out.logits, alone)
            torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(alone.float(), labels))


def kinds(name: str) -> list[str]:
    cls = ATTENTION.get(name)
    return (["lm"] if cls.supports_causal else []) + ([] if cls.causal_only else ["classifier"])


def cheap(name: str, kind: str) -> bool:
    """A refusal costs a build; an equality runs every document: only FAST's in the default run."""
    return not ATTENTION.get(name).packs_documents or (name, kind) in FAST


CASES = [
    pytest.param(name, kind, marks=() if cheap(name, kind) else pytest.mark.slow, id=f"{name}-{kind}")
    for name in NAMES
    for kind in kinds(name)
]


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_a_packed_row_equals_its_documents_alone_or_packing_is_refused(name, kind):
    cls = ATTENTION.get(name)
    options = cls.contract_options()
    options.pop(cls.memory_option, None)  # segment memory carried across calls refuses packing (tested below)
    m = model(kind, {"name": name, **options})
    reason = m.packing_refusal()
    if reason is not None:
        assert repr(name) in reason  # the refusal names the part (a packing part may refuse an option or direction)
        _, batch = packed_rows()
        with pytest.raises(ValueError, match="cannot take packed documents"):
            m(batch["tokens"], pad_mask=batch["pad_mask"], documents=batch["documents"])
        return
    assert_packed_equals_alone(m, kind)


def test_every_mechanism_answers_whether_it_packs():
    """Every registered mechanism either packs or says why not (its own reason, not the default)."""
    for name in NAMES:
        cls = ATTENTION.get(name)
        assert cls.packs_documents or cls.no_packing_reason, f"{name} refuses packing without a reason"


def test_the_equality_fails_for_a_mechanism_that_lets_tokens_see_another_document(monkeypatch):
    """Vanilla with its document mask removed (it still accepts packing): the packed row no longer equals its
    documents alone, so the test above would catch a mechanism that leaks."""
    m = model("lm", {"name": "vanilla"})
    assert_packed_equals_alone(m, "lm")

    def leaking(self, x, pad_mask, documents):
        return VanillaAttention.forward(self, x, pad_mask=pad_mask)

    monkeypatch.setattr(VanillaAttention, "attend_documents", leaking)
    with pytest.raises(AssertionError):
        assert_packed_equals_alone(m, "lm")


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"position": "learned"}, id="learned"),
        pytest.param({"position": "rope"}, id="rope", marks=pytest.mark.slow),
        pytest.param({"position": "alibi"}, id="alibi", marks=pytest.mark.slow),
        pytest.param({"position": "t5_bias"}, id="t5_bias", marks=pytest.mark.slow),
        pytest.param({"stack": "reversible", "residual": "pre_norm"}, id="reversible"),
        pytest.param({"feed_forward": "swiglu"}, id="swiglu", marks=pytest.mark.slow),
    ],
)
def test_positions_and_stacks_keep_documents_apart(overrides):
    """Learned and sinusoidal signals number each document from 0; relative ones (rope, ALiBi, T5) keep the
    row's positions (their scores depend on i - j only); the reversible stack gives every branch the ids."""
    m = model("lm", {"name": "vanilla"}, **overrides)
    assert m.packing_refusal() is None
    assert_packed_equals_alone(m, "lm")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("gla", {"chunk_size": 32}),
        ("gla", {"chunk_size": 4}),
        ("retention", {"chunk_size": 4}),
        ("vanilla", {"softcap": 5.0}),
        ("deltanet", {"chunk_size": 8, "conv_size": 4}),
        ("mamba2", {"chunk_size": 64, "conv_size": 4}),
    ],
)
def test_kernel_options_keep_documents_apart(name, options):
    """The decay kernels with chunks holding several boundaries (and GLA's secondary blocks of 16 inside a chunk
    of 32), vanilla's soft-capped path, the delta rule's chunk form over chunks of 8 and its recurrent form
    (rows shorter than a chunk of 64)."""
    assert_packed_equals_alone(model("lm", {"name": name, **options}), "lm")


def test_a_packed_row_trains_with_gradients_equal_to_its_documents_alone():
    """Backward too: the gradient of the packed loss (summed) is the sum of the documents' own."""
    m = model("lm", {"name": "retention", "chunk_size": 4}).train()
    rows, batch = packed_rows()
    per_doc, targets = lm_targets(rows)
    out = m(batch["tokens"], targets, pad_mask=batch["pad_mask"], documents=batch["documents"])
    (out.loss * out.stats["scored"]).backward()
    packed = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    for docs, ts in zip(rows, per_doc):
        for d, t in zip(docs, ts):
            alone = m(d[None], t[None])
            (alone.loss * alone.stats["scored"]).backward()
    for a, b in zip(packed, (p.grad for p in m.parameters())):
        torch.testing.assert_close(a, b)


def test_refusals_name_the_part():
    """The refusal says which part and why: a stack, a position option, a feed-forward that mixes positions."""
    assert "stack 'universal'" in model("lm", {"name": "vanilla"}, stack="universal", position="none").packing_refusal()
    learned = {"name": "learned", "random_offset_max": 4}
    assert "random_offset_max" in model("lm", {"name": "vanilla"}, position=learned).packing_refusal()
    assert "lsh" in model("lm", {"name": "lsh"}).packing_refusal()
    assert "segment memory" in model("lm", {"name": "vanilla", "max_cache": 8}).packing_refusal()


def test_document_helpers():
    documents = torch.tensor([[0, 0, 1, 1, 1, 2], [3, 3, 3, 3, 4, 4]])
    assert positions_in_documents(documents).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 0, 1]]
    assert segment_ids(documents).tolist() == [[0, 0, 1, 1, 1, 2], [0, 0, 0, 0, 1, 1]]


@pytest.mark.parametrize("chunk", [4, 8])
def test_kernelised_sums_restart_at_every_segment_across_chunks(chunk):
    """The causal kernelised product over packed segments (chunks of 4 and 8 holding several boundaries) equals
    each segment's own product: the carried sums S, z are emptied where a segment starts."""
    generator = torch.Generator().manual_seed(0)
    lengths = [5, 1, 9, 3, 6]
    phi_q, phi_k = (torch.rand(2, 3, sum(lengths), 4, generator=generator, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, sum(lengths), 5, generator=generator, dtype=torch.float64)
    segments = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]).expand(2, -1)
    out, _, _ = causal_kernel_attention(phi_q, phi_k, v, 1e-6, chunk_size=chunk, segments=segments)
    alone = [
        causal_kernel_attention(*(x[:, :, a:b] for x in (phi_q, phi_k, v)), 1e-6, chunk_size=chunk)[0]
        for a, b in zip([0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()], torch.tensor(lengths).cumsum(0).tolist())
    ]
    torch.testing.assert_close(out, torch.cat(alone, dim=2))


@pytest.mark.parametrize("kind", ["lm", "classifier"])
def test_dense_attention_over_document_spans(kind, monkeypatch):
    """Vanilla attends a block of queries at a time over the keys their documents span: blocks of 4 queries
    (several blocks per document, several documents per block, causal and bidirectional) equal documents alone."""
    monkeypatch.setattr(document_attention, "DOCUMENT_BLOCK", 4)
    assert_packed_equals_alone(model(kind, {"name": "vanilla"}, position="alibi"), kind)


@pytest.mark.slow  # compiles FlexAttention (12-24 s a case on this CPU)
@pytest.mark.parametrize("causal", [True, False])
def test_flex_backend_keeps_documents_apart_in_its_mask_mod(causal):
    """backend=flex (forward only on the CPU): the document test inside the BlockMask's mask_mod gives what the
    native path gives over the same packed rows."""
    kind = "lm" if causal else "classifier"
    native = model(kind, {"name": "vanilla", "backend": "native"}).float()
    flex = model(kind, {"name": "vanilla", "backend": "flex"}).float()
    flex.load_state_dict(native.state_dict())
    _, batch = packed_rows()
    with torch.no_grad():
        expected = native(batch["tokens"], pad_mask=batch["pad_mask"], documents=batch["documents"]).logits
        got = flex(batch["tokens"], pad_mask=batch["pad_mask"], documents=batch["documents"]).logits
    real = batch["pad_mask"] if causal else slice(None)
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


def test_bad_document_ids_are_refused_with_the_reason():
    m = model("lm", {"name": "vanilla"})
    _, batch = packed_rows()
    with pytest.raises(ValueError, match="in order"):
        m(batch["tokens"], documents=batch["documents"].flip(1))
    with pytest.raises(ValueError, match=r"integer tensor \[b, t\]"):
        m(batch["tokens"], documents=batch["documents"][:, :5])
    with pytest.raises(ValueError, match="state=None"):
        m(batch["tokens"], documents=batch["documents"], state=m.init_state(2))
