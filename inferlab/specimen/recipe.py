"""Constructed weights for pythia-14m's architecture that behave like a trained model's, built without training.

Both offline specimens (the stand-in and the replica) take their weights from here. The recipe reads no tokenizer:
every choice is made on token *ids* by a seeded generator, so the same bytes serve any 50,304-row vocabulary. Nothing
is learned from text; the structure is written down directly.

The shape, in the residual stream of width 128 (all numbers are the constants below):

    dims 0..39    A: which of 40 clusters the current token belongs to (one-hot, from the embedding)
    dims 40..79   B: the cluster of the previous token (copied there by two layer-0 heads that attend
                  to relative position 1, using rotary positions only)
    dims 80..119  C: the cluster of the token two back (two layer-0 heads at relative position 2)
    dim  120      a constant (final layer norm bias) that carries each token's own frequency score
    dims 121..127 a small random code per token, so that no two candidates tie exactly

The unembedding turns that state into next-token logits:

    logit(v) = MU_A * [cluster(v) = succ_A(cluster(cur))]
             + MU_B * [cluster(v) = succ_B(cluster(prev))]
             + MU_C * [cluster(v) = succ_C(cluster(prev2))]
             + head(cluster(v)) - ZIPF * log(1 + rank(v))        (frequency within a cluster)
             + small token-code and layer noise terms,

so the next token is drawn mostly from three "successor" clusters picked by the last three tokens, and within a
cluster from a few frequent ids. That gives peaked, context-dependent distributions with logits spanning tens of units
(greedy follows a chain; T=0.5 concentrates; top-p 0.8 keeps few ids).

EOS (id 0) is in no cluster. After a token of one of the EOS_CLUSTERS it gets logit MU_EOS, a strong candidate that is
the argmax only where all three successor heads score below it (MU_EOS = MU + 1.2, and heads score MU + HEAD_RANGE):
sampling stops early now and then (about a third of the matrix's sampling trials), while greedy almost never does
(under 2 % of contexts, tested). A variant (`forced_eos_clusters`) makes EOS the clear argmax after the given
clusters, for tests of early stops.

Layers 1-5 and all MLPs hold small seeded noise (NOISE_STD): they perturb the logits slightly, the way any extra
computation would, without carrying the structure. Corrupting the positions the layer-0 heads see (a position shifted
by one, a stale cache entry) moves B and C to the wrong tokens, so the logits change by several units: the cache test
keeps its power to catch a real bug.

Weights are float16, as in the real checkpoint, and byte-identical on every machine (numpy PCG64)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

VERSION = "v3"
SEED = 14

VOCAB = 50304
HIDDEN = 128
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
ROTARY_DIMS = 8  # rotary_pct 0.25 of the head dim
ROTARY_BASE = 10000
LAYERS = 6
INTERMEDIATE = 512
EOS_ID = 0

CLUSTERS = 40
A_DIMS = range(0, CLUSTERS)
B_DIMS = range(CLUSTERS, 2 * CLUSTERS)
C_DIMS = range(2 * CLUSTERS, 3 * CLUSTERS)
BIAS_DIM = 3 * CLUSTERS
CODE_DIMS = range(3 * CLUSTERS + 1, HIDDEN)

RESIDUAL_SCALE = 4.0  # size of a one-hot cluster entry in the residual stream
CODE_SCALE = 0.4  # size of a token's tie-breaking code in the residual stream
MU_A = MU_B = MU_C = 12.0  # logit boosts of the three successor clusters: equal, so each context decides
HEAD_RANGE = (0.8, 2.4)  # each cluster's most frequent token: its frequency score, drawn uniformly
ZIPF = 2.0  # within a cluster, score = head - ZIPF * log(1 + rank)
CODE_LOGIT = 0.25  # typical size of the tie-breaking term, in logits
EOS_CLUSTER_COUNT = 12  # after a token of these clusters, EOS is a strong candidate
MU_EOS = 13.2  # EOS logit there: greedy picks it only when all three successor heads are weaker
FORCED_EOS_LOGIT = 30.0  # a variant's EOS after a forced cluster: above anything else
FORCED_TOKEN_LOGIT = 40.0  # a variant's forced token: above any id, even one two successor clusters boost
NOISE_STD = 0.01  # layers 1-5 and the MLPs
ATTENTION_GAP = 14.0  # softmax-score margin of the positional heads' target over any other position
HEAD_OFFSETS = (1, 1, 2, 2)  # the relative position each layer-0 head attends to
MAX_POSITIONS = 512  # the positional heads are checked to prefer their offset up to this distance


@dataclasses.dataclass(frozen=True)
class Variant:
    """A recipe variation for tests: EOS becomes the argmax after any token of `forced_eos_clusters`;
    `forced_token` (if set) becomes the argmax after every token."""

    forced_eos_clusters: tuple[int, ...] = ()
    forced_token: Optional[int] = None

    def describe(self) -> str:
        parts = []
        if self.forced_eos_clusters:
            parts.append(f"forced_eos_clusters={list(self.forced_eos_clusters)}")
        if self.forced_token is not None:
            parts.append(f"forced_token={self.forced_token}")
        return ", ".join(parts) or "base"


BASE = Variant()


@dataclasses.dataclass(frozen=True)
class Structure:
    """The id-level choices of the recipe: cluster, rank and code of every id, and the successor maps."""

    cluster: np.ndarray  # (VOCAB,) int: cluster of each id (EOS has one too, for when it is the current token)
    rank: np.ndarray  # (VOCAB,) int: frequency rank of each id within its cluster, 0 = most frequent
    head_score: np.ndarray  # (CLUSTERS,) float: frequency score of each cluster's rank-0 id
    successor: dict  # "A" | "B" | "C" -> (CLUSTERS,) int permutation: cluster -> successor cluster
    eos_clusters: np.ndarray  # (EOS_CLUSTER_COUNT,) int
    code: np.ndarray  # (VOCAB, len(CODE_DIMS)) float: unit tie-breaking code of each id

    def frequency_score(self) -> np.ndarray:
        """(VOCAB,) each id's own score: its cluster head's score minus ZIPF * log(1 + rank)."""
        return self.head_score[self.cluster] - ZIPF * np.log1p(self.rank)


def structure(seed: int = SEED) -> Structure:
    """Draw the recipe's id-level structure from numpy's PCG64 generator (the same on every machine)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    order = rng.permutation(VOCAB)  # ids in a random order, dealt to clusters round-robin
    cluster = np.empty(VOCAB, dtype=np.int64)
    rank = np.empty(VOCAB, dtype=np.int64)
    cluster[order] = np.arange(VOCAB) % CLUSTERS
    rank[order] = np.arange(VOCAB) // CLUSTERS
    head_score = rng.uniform(*HEAD_RANGE, size=CLUSTERS)
    successor = {channel: _cycle(rng.permutation(CLUSTERS)) for channel in "ABC"}
    eos_clusters = np.sort(rng.choice(CLUSTERS, size=EOS_CLUSTER_COUNT, replace=False))
    code = rng.standard_normal((VOCAB, len(CODE_DIMS)))
    code /= np.linalg.norm(code, axis=1, keepdims=True)
    return Structure(cluster, rank, head_score, successor, eos_clusters, code)


def _cycle(order: np.ndarray) -> np.ndarray:
    """The permutation that sends order[i] to order[i+1] (and the last back to the first): one single cycle.

    A random permutation usually has fixed points, and a cluster that succeeds itself makes greedy
    repeat one token forever; one cycle through all clusters has no fixed point and no short loop.
    """
    successor = np.empty_like(order)
    successor[order] = np.roll(order, -1)
    return successor


# --- the positional heads ------------------------------------------------------------------------------


def rotary_frequencies() -> np.ndarray:
    """(ROTARY_DIMS/2,) the angular frequencies GPT-NeoX's rotary embedding uses: base^(-2i/rotary_dims)."""
    return ROTARY_BASE ** (-np.arange(0, ROTARY_DIMS, 2) / ROTARY_DIMS)


def positional_amplitudes(offset: int) -> np.ndarray:
    """Per-frequency score amplitudes whose scores peak at `offset` by ATTENTION_GAP over every other distance.

    The fastest frequency alone nearly repeats every 2*pi positions; the slower ones break those near-ties.
    The mix is a fixed rule, checked by `attention_gap` below rather than trusted.
    """
    weights = np.array([1.0, 1.0, 0.6, 0.3])
    gap = attention_gap(weights, offset)
    return weights * (ATTENTION_GAP / gap)


def attention_gap(amplitudes: np.ndarray, offset: int) -> float:
    """Attention score (after 1/sqrt(head_dim) scaling) at `offset` minus the best score at any other distance in
    0..MAX_POSITIONS."""
    distances = np.arange(MAX_POSITIONS + 1)
    scores = (amplitudes[None, :] * np.cos(rotary_frequencies()[None, :] * (distances[:, None] - offset))).sum(axis=1)
    return float(scores[offset] - np.delete(scores, offset).max())


def _positional_qk(amplitudes: np.ndarray, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Constant query and key vectors (HEAD_DIM,) whose rotary dot product peaks at relative `offset`.

    In GPT-NeoX's rotary layout pair i is (i, i + ROTARY_DIMS/2); a pair acts like the complex number
    x_i + i*x_{i+half}, rotated by position*omega_i, so q.k = sum_i |q_i||k_i| cos(omega_i*(p-j) + phase_i).
    """
    half = ROTARY_DIMS // 2
    omega = rotary_frequencies()
    magnitude = np.sqrt(amplitudes * math.sqrt(HEAD_DIM))  # the eager attention multiplies by 1/sqrt(head_dim)
    query, key = np.zeros(HEAD_DIM), np.zeros(HEAD_DIM)
    phase = -omega * offset
    query[:half], query[half:ROTARY_DIMS] = magnitude * np.cos(phase), magnitude * np.sin(phase)
    key[:half] = magnitude
    return query, key


# --- the tensors ---------------------------------------------------------------------------------------


LAYER_SHAPES = {  # one layer's tensors, by their names in pythia-14m after gpt_neox.layers.<i>.
    "input_layernorm.weight": (HIDDEN,), "input_layernorm.bias": (HIDDEN,),
    "post_attention_layernorm.weight": (HIDDEN,), "post_attention_layernorm.bias": (HIDDEN,),
    "attention.query_key_value.weight": (3 * HIDDEN, HIDDEN), "attention.query_key_value.bias": (3 * HIDDEN,),
    "attention.dense.weight": (HIDDEN, HIDDEN), "attention.dense.bias": (HIDDEN,),
    "mlp.dense_h_to_4h.weight": (INTERMEDIATE, HIDDEN), "mlp.dense_h_to_4h.bias": (INTERMEDIATE,),
    "mlp.dense_4h_to_h.weight": (HIDDEN, INTERMEDIATE), "mlp.dense_4h_to_h.bias": (HIDDEN,),
}


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """Names and shapes of pythia-14m's 76 tensors (gpt_neox.*, embed_out), the layout the recipe fills."""
    layers = {f"gpt_neox.layers.{i}.{name}": shape for i in range(LAYERS) for name, shape in LAYER_SHAPES.items()}
    return {"gpt_neox.embed_in.weight": (VOCAB, HIDDEN), **layers, "gpt_neox.final_layer_norm.weight": (HIDDEN,),
            "gpt_neox.final_layer_norm.bias": (HIDDEN,), "embed_out.weight": (VOCAB, HIDDEN)}


def _final_norm_levels() -> tuple[float, float]:
    """(on, off): a layer-normed state's value at a present cluster entry and at an absent one.

    The state after layer 0 holds three cluster entries of RESIDUAL_SCALE (A, B, C) and a code of norm
    CODE_SCALE; layer norm subtracts the mean, so absent entries sit slightly below zero. Only on - off
    matters below, and it is 1/std of the state whatever the mean.
    """
    mean = 3 * RESIDUAL_SCALE / HIDDEN
    std = math.sqrt((3 * RESIDUAL_SCALE**2 + CODE_SCALE**2) / HIDDEN - mean**2)
    return (RESIDUAL_SCALE - mean) / std, -mean / std


def weights(variant: Variant = BASE, seed: int = SEED) -> dict[str, np.ndarray]:
    """All 76 tensors as float16 arrays, keyed by name, in expected_shapes() order."""
    s = structure(seed)
    noise = np.random.Generator(np.random.PCG64([seed, 1]))  # a second stream: structure draws stay fixed
    tensors: dict[str, np.ndarray] = {}

    # 1) embedding: the current token's cluster in A, its code in the code dims
    embed = np.zeros((VOCAB, HIDDEN))
    embed[np.arange(VOCAB), s.cluster] = RESIDUAL_SCALE
    embed[:, CODE_DIMS.start:CODE_DIMS.stop] = CODE_SCALE * s.code
    tensors["gpt_neox.embed_in.weight"] = embed

    # 2) layer 0: four positional heads copy A of the token 1 or 2 back into B or C
    single = RESIDUAL_SCALE * math.sqrt(HIDDEN / (RESIDUAL_SCALE**2 + CODE_SCALE**2))  # a bare embedding's entry
    qkv_weight = np.zeros((3 * HIDDEN, HIDDEN))
    qkv_bias = np.zeros(3 * HIDDEN)
    dense = np.zeros((HIDDEN, HIDDEN))
    half = CLUSTERS // 2  # each head carries half of the 40 cluster dims in its 32 value dims
    targets = {1: B_DIMS, 2: C_DIMS}
    for head, offset in enumerate(HEAD_OFFSETS):
        base = head * 3 * HEAD_DIM  # per head: query, key, value rows
        query, key = _positional_qk(positional_amplitudes(offset), offset)
        qkv_bias[base:base + HEAD_DIM] = query
        qkv_bias[base + HEAD_DIM:base + 2 * HEAD_DIM] = key
        part = head % 2  # which half of the clusters this head copies
        for j in range(half):
            cluster_dim = part * half + j
            qkv_weight[base + 2 * HEAD_DIM + j, A_DIMS[cluster_dim]] = 1.0
            dense[targets[offset][cluster_dim], head * HEAD_DIM + j] = RESIDUAL_SCALE / single
    for layer in range(LAYERS):
        prefix = f"gpt_neox.layers.{layer}."
        for name in ("input_layernorm", "post_attention_layernorm"):
            tensors[prefix + name + ".weight"] = np.ones(HIDDEN)
            tensors[prefix + name + ".bias"] = np.zeros(HIDDEN)
        if layer == 0:
            tensors[prefix + "attention.query_key_value.weight"] = qkv_weight
            tensors[prefix + "attention.query_key_value.bias"] = qkv_bias
            tensors[prefix + "attention.dense.weight"] = dense
        else:
            qkv_noise = noise.standard_normal((3 * HIDDEN, HIDDEN))
            tensors[prefix + "attention.query_key_value.weight"] = NOISE_STD * qkv_noise
            tensors[prefix + "attention.query_key_value.bias"] = np.zeros(3 * HIDDEN)
            tensors[prefix + "attention.dense.weight"] = NOISE_STD * noise.standard_normal((HIDDEN, HIDDEN))
        tensors[prefix + "attention.dense.bias"] = np.zeros(HIDDEN)
        tensors[prefix + "mlp.dense_h_to_4h.weight"] = NOISE_STD * noise.standard_normal((INTERMEDIATE, HIDDEN))
        tensors[prefix + "mlp.dense_h_to_4h.bias"] = np.zeros(INTERMEDIATE)
        tensors[prefix + "mlp.dense_4h_to_h.weight"] = NOISE_STD * noise.standard_normal((HIDDEN, INTERMEDIATE))
        tensors[prefix + "mlp.dense_4h_to_h.bias"] = np.zeros(HIDDEN)

    # 3) final layer norm: unit weights, but the constant dimension carries only its bias
    final_weight = np.ones(HIDDEN)
    final_weight[BIAS_DIM] = 0.0
    final_bias = np.zeros(HIDDEN)
    final_bias[BIAS_DIM] = 1.0
    tensors["gpt_neox.final_layer_norm.weight"] = final_weight
    tensors["gpt_neox.final_layer_norm.bias"] = final_bias

    # 4) unembedding: successor clusters, frequency scores, codes, and EOS. Layer norm leaves one entry of a
    #    cluster block `on` and the rest at one shared `off` level, so each block of a row is written as
    #    the logits it should give for each present cluster, minus their mean: the shared level cancels,
    #    and the mean goes to the constant dimension. The logit is then exactly the one intended.
    on, off = _final_norm_levels()
    unembed = np.zeros((VOCAB, HIDDEN))
    rows = np.arange(VOCAB)
    constant = s.frequency_score()
    for channel, dims, mu in (("A", A_DIMS, MU_A), ("B", B_DIMS, MU_B), ("C", C_DIMS, MU_C)):
        predecessor = np.argsort(s.successor[channel])  # successor[predecessor[k]] == k
        block = np.zeros((VOCAB, CLUSTERS))
        block[rows, predecessor[s.cluster]] = mu
        constant = constant + block.mean(axis=1)
        unembed[:, dims.start:dims.stop] = (block - block.mean(axis=1, keepdims=True)) / (on - off)
    code_size = CODE_SCALE * on / RESIDUAL_SCALE  # a code entry scales like a cluster entry, without the mean
    unembed[:, CODE_DIMS.start:CODE_DIMS.stop] = (CODE_LOGIT / code_size) * s.code
    # EOS is in no cluster: its logit depends only on the current token's cluster
    eos_block = np.zeros(CLUSTERS)
    eos_block[s.eos_clusters] = MU_EOS
    eos_block[list(variant.forced_eos_clusters)] = FORCED_EOS_LOGIT
    unembed[EOS_ID] = 0.0
    unembed[EOS_ID, A_DIMS.start:A_DIMS.stop] = (eos_block - eos_block.mean()) / (on - off)
    constant[EOS_ID] = eos_block.mean()
    if variant.forced_token is not None:
        constant[variant.forced_token] = FORCED_TOKEN_LOGIT
    unembed[:, BIAS_DIM] = constant
    tensors["embed_out.weight"] = unembed
    return {name: tensors[name].astype(np.float16) for name in expected_shapes()}  # its layout, checked by the tests
