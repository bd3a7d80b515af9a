"""Whether a draft's tokenizer matches the target's: one rule for `generate`, `bench`, `chat` and
`doctor`.

Token ids must mean the same text on both sides. Sizes may differ by a little: model families pad
their vocabularies to different multiples (Qwen2.5-7B has 152064 ids, Qwen2.5-0.5B 151936) with
unused ids at the end, and llama.cpp's own speculative example tolerates 128. Exactness does not
depend on the sizes: a drafted id the target lacks has p = 0 and is rejected, and target ids the
draft lacks have q = 0, which the residual covers.
"""

from __future__ import annotations

from localspec.config import ConfigError

VOCAB_SIZE_SLACK = 128


def compare(target, draft) -> dict:
    """The two tokenizers side by side, with every reason they cannot work together.

    Works on any objects with n_vocab, token_text(id), bos, eos and eot (meta(key) optional)."""
    def kind(m):
        return m.meta("tokenizer.ggml.model") if hasattr(m, "meta") else None

    n = min(target.n_vocab, draft.n_vocab)
    differ = [t for t in range(n) if target.token_text(t) != draft.token_text(t)]
    gap = abs(target.n_vocab - draft.n_vocab)
    special = {s: {"target": getattr(target, s), "draft": getattr(draft, s)} for s in ("bos", "eos", "eot")}
    problems = []
    if kind(target) != kind(draft):
        problems.append(f"tokenizer types differ ({kind(draft)} vs {kind(target)})")
    if gap > VOCAB_SIZE_SLACK:
        problems.append(f"sizes differ ({draft.n_vocab} vs {target.n_vocab} tokens, more than the "
                        f"{VOCAB_SIZE_SLACK} ids of padding tolerated)")
    problems += [f"{s.upper()} differs (id {v['draft']} vs {v['target']})" for s, v in special.items()
                 if v["target"] != v["draft"]]
    if differ:
        problems.append(f"{len(differ)} token texts differ, first at token id {differ[0]}")
    return {
        "compatible": not problems,
        "verdict": "incompatible" if problems else ("compatible (padded)" if gap else "compatible"),
        "n_vocab": {"target": target.n_vocab, "draft": draft.n_vocab},
        "tokenizer": {"target": kind(target), "draft": kind(draft)},
        "special": special,
        "n_differing": len(differ),
        "first_differing_id": differ[0] if differ else (n if gap > VOCAB_SIZE_SLACK else None),
        "problems": problems,
    }


def check(target, draft) -> None:
    """Refuse a draft whose tokenizer differs from the target's: ids would mean different text."""
    problems = compare(target, draft)["problems"]
    if problems:
        raise ConfigError(f"the draft cannot serve this target: draft {draft.path} and target "
                          f"{target.path}: {'; '.join(problems)}")
