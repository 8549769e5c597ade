"""The cl100k-derived vocabularies as data (dolma2, OLMo 3's; dolma2-proxy32k, its 32k proxy):
sizes, special tokens, EOS/PAD and the sha256 of each ranks file. No tokenizer engine is imported
here, so the trainer can check a task file's tokenizer entry without loading quicktok or tiktoken;
`pipelines.dolma2_tokenizer` builds the encoders over these and re-exports them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CL100K_RANKS_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
NUM_RANKS = 100256  # cl100k_base's ordinary tokens: ids 0..100255

# dolma2's added tokens (allenai/dolma2-tokenizer), in id order from 100256.
SPECIAL_TOKENS: dict[str, int] = {
    "<|extra_id_0|>": 100256,
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "|||PHONE_NUMBER|||": 100261,
    "|||EMAIL_ADDRESS|||": 100262,
    "|||IP_ADDRESS|||": 100263,
    "<|im_start|>": 100264,
    "<|im_end|>": 100265,
    **{f"<|extra_id_{i}|>": 100265 + i for i in range(1, 11)},
    "<|endofprompt|>": 100276,
    "<|pad|>": 100277,
}
EOS_ID = SPECIAL_TOKENS["<|endoftext|>"]
PAD_ID = SPECIAL_TOKENS["<|pad|>"]
VOCAB_SIZE = 100278
BOS_ID = None  # dolma2 has no BOS token

# dolma2-proxy32k: a real BPE tokenizer small enough for a one-chip proxy of the 7B model (fp32
# Adam on a 100,278-row embedding and LM head alone is 13 GB). cl100k's ranks are in merge
# order with the 256 single bytes at ranks 0..255, so its first PROXY32K_NUM_RANKS ranks are a
# complete byte-level BPE (every string encodes; decoding gives it back: tested) of 32,766
# ordinary ids; dolma2's EOS and PAD texts follow, for 32,768 ids (a multiple of 256, the MXU).
PROXY32K_NUM_RANKS = 32766
PROXY32K_RANKS_SHA256 = "37d312afd9b66f20194e9dd79621910ed54fd749eedae0ecffa7e785bcdb0598"  # its 32,766 lines
PROXY32K_SPECIAL_TOKENS: dict[str, int] = {"<|endoftext|>": PROXY32K_NUM_RANKS, "<|pad|>": PROXY32K_NUM_RANKS + 1}


@dataclass(frozen=True)
class Vocabulary:
    """A cl100k-derived vocabulary: ordinary ids 0..num_ranks-1 are cl100k_base's first
    `num_ranks` ranks (the same bytes), then `special_tokens` (text → id). `ranks_sha256`: the
    sha256 of its ranks file, cl100k_base.tiktoken's first `num_ranks` lines (the whole file for
    dolma2); with vocab_size, EOS and PAD it is what the manifest and the model config record."""

    name: str
    num_ranks: int
    special_tokens: Mapping[str, int]
    eos_id: int
    pad_id: int
    ranks_sha256: str

    @property
    def vocab_size(self) -> int:
        return self.num_ranks + len(self.special_tokens)

    @property
    def full_cl100k(self) -> bool:
        return self.num_ranks == NUM_RANKS


DOLMA2 = Vocabulary("dolma2", NUM_RANKS, SPECIAL_TOKENS, EOS_ID, PAD_ID, CL100K_RANKS_SHA256)
PROXY32K = Vocabulary(
    "dolma2-proxy32k",
    PROXY32K_NUM_RANKS,
    PROXY32K_SPECIAL_TOKENS,
    PROXY32K_SPECIAL_TOKENS["<|endoftext|>"],
    PROXY32K_SPECIAL_TOKENS["<|pad|>"],
    PROXY32K_RANKS_SHA256,
)
VOCABULARIES: dict[str, Vocabulary] = {v.name: v for v in (DOLMA2, PROXY32K)}
