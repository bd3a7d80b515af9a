"""Stop strings: the text, the tokens, their counts and the target's cache end at the stop.

The rule (module doc of localspec.decoding.stream): the text shown is everything before the stop string;
the tokens kept are those whose text starts before it (the one it begins in is kept); the cache
holds the prompt and the kept tokens but the last, as after any run.
"""

from __future__ import annotations

import pytest

from localspec.config import DecodeConfig, SamplingConfig
from localspec.decoding.decoder import generate_steps
from localspec.decoding.drafters import PromptLookup
from localspec.decoding.model_drafter import ModelDrafter
from localspec.decoding.stats import RunStats
from localspec.decoding.stream import TextStream, stream_text

GREEDY = SamplingConfig(temperature=0.0)
PROMPT = "Tell me about lighthouses."
N_PLAIN = 40


# ---- the rule on synthetic pieces, multi-byte characters split across tokens -------------------

# "ab" + é (C3 A9) split over tokens 1 and 2, then € (E2 82 AC) over tokens 3, 4 and 5.
PIECES = {1: b"ab\xc3", 2: b"\xa9cd", 3: b"\xe2", 4: b"\x82", 5: b"\xacX", 6: b"yz"}
TEXT = "ab\u00e9cd\u20acXyz"


def _run_stream(stop, pushes):
    """Push token groups (as decoder steps would) until a stop; (shown, kept tokens, their pieces, keeps)."""
    stream = TextStream(PIECES.__getitem__, stop)
    shown, kept, pieces, keeps = "", [], [], []
    for i, group in enumerate(pushes):
        keep = stream.push(group)
        keeps.append(keep)
        text, released = stream.take(final=keep is not None or i == len(pushes) - 1)
        shown += text
        kept += [t for t, _ in released]
        pieces += [p for _, p in released]
        if keep is not None:
            break
    return shown, kept, pieces, keeps


@pytest.mark.parametrize("stop,shown,kept", [
    ("\u00e9", "ab", [1]),              # é begins in token 1's last byte: token 1 made "ab", kept
    ("\u00e9c", "ab", [1]),
    ("b\u00e9", "a", [1]),              # begins inside token 1
    ("d\u20ac", "ab\u00e9c", [1, 2]),   # tokens 3-4 made no character yet: they belong to €
    ("\u20ac", "ab\u00e9cd", [1, 2]),
    ("X", "ab\u00e9cd\u20ac", [1, 2, 3, 4, 5]),   # begins inside token 5, which starts at €
    ("yz", "ab\u00e9cd\u20acX", [1, 2, 3, 4, 5]),
    ("ab", "", []),
    ("nowhere", TEXT, [1, 2, 3, 4, 5, 6]),
])
@pytest.mark.parametrize("pushes", [[[1, 2, 3, 4, 5, 6]], [[1], [2], [3], [4], [5], [6]], [[1, 2], [3, 4, 5], [6]]])
def test_stop_rule_with_multibyte_characters_split_across_tokens(stop, shown, kept, pushes):
    got_shown, got_kept, pieces, keeps = _run_stream((stop,), pushes)
    assert got_shown == shown
    assert got_kept == kept
    assert "".join(pieces) == shown   # the pieces (for highlighting) end at the stop too
    if stop in TEXT:
        # What the decoder is told to keep of the last push (negative: earlier pushes' tokens too)
        # leaves exactly the kept tokens.
        n_before = sum(len(g) for g in pushes[: len(keeps) - 1])
        assert n_before + keeps[-1] == len(kept)
    else:
        assert set(keeps) == {None}


def test_a_tail_that_may_begin_a_stop_string_is_held_back_then_released():
    stream = TextStream(PIECES.__getitem__, ("cdX",))
    assert stream.push([1, 2]) is None
    assert stream.take() == ("ab\u00e9", [(1, "ab")])   # "cd" may begin the stop; token 2 too
    assert stream.push([3, 4]) is None
    assert stream.take() == ("", [])                     # € not complete: still undecided
    assert stream.push([5]) is None                      # "cd€X" is not "cdX": all released
    assert stream.take() == ("cd\u20acX", [(2, "\u00e9cd"), (3, ""), (4, ""), (5, "\u20acX")])


def test_a_character_the_last_tokens_never_finished_is_left_out_not_shown_as_fffd():
    """--max-tokens may end the output inside a character: generate, chat and serve all take their
    text from this stream, which shows whole characters only."""
    stream = TextStream(PIECES.__getitem__)
    assert stream.push([1, 2, 3, 4]) is None   # tokens 3-4 began € but never finished it
    text, released = stream.take(final=True)
    assert text == "ab\u00e9cd" and "\ufffd" not in text
    assert [t for t, _ in released] == [1, 2, 3, 4]   # the tokens are still the output's


# ---- the real model: greedy, so the plain run's text is known ---------------------------------

@pytest.fixture(scope="module")
def plain(target):
    prompt = target.chat_prompt([{"role": "user", "content": PROMPT}])
    steps = list(generate_steps(target, None, prompt, GREEDY, DecodeConfig(max_tokens=N_PLAIN, k=0)))
    tokens = [t for s in steps for t in s.tokens]
    return prompt, tokens


def _expected(target, tokens, stop):
    """The rule applied to the plain run: (shown text, kept tokens, tokens needed to complete it)."""
    starts = [len(target.detokenize(tokens[:i])) for i in range(len(tokens))]
    text = target.detokenize(tokens)
    assert text.isascii()   # starts are exact for ASCII text; multi-byte cases are tested above
    at = text.find(stop)
    assert at >= 0, f"{stop!r} is not in the plain run's text {text!r}"
    complete = next(j for j in range(1, len(tokens) + 1) if stop in target.detokenize(tokens[:j]))
    return text[:at], [t for t, s in zip(tokens, starts) if s < at], complete


def _drafter(kind, draft):
    if kind == "plain":
        return None
    return ModelDrafter(draft) if kind == "model" else PromptLookup()


def _stream(target, drafter, prompt, stop, max_tokens, k):
    stats = RunStats()
    text, tokens, pieces = "", [], ""
    for chunk in stream_text(target, drafter, prompt, GREEDY, DecodeConfig(max_tokens=max_tokens, k=k, stop=(stop,))):
        stats.add(chunk.step)
        text += chunk.text
        tokens += chunk.tokens
        pieces += "".join(p for p, _ in chunk.pieces)
        assert len(chunk.tokens) == len(chunk.pieces)
    return text, tokens, pieces, stats


STOPS = {
    " structures": "at a token boundary",
    "houses": "beginning inside a token ('ighth|ouses')",
    "ey're": "spanning two tokens, beginning inside the first (' They|'re')",
    " awe-insp": "three whole tokens (' awe|-|insp'): a plain run takes back two earlier steps",
}


@pytest.mark.parametrize("kind,k", [("plain", 0), ("model", 4), ("lookup", 6)])
@pytest.mark.parametrize("stop", list(STOPS))
def test_stop_string_trims_text_tokens_counts_and_cache(target, draft, plain, kind, k, stop):
    prompt, tokens = plain
    shown, kept, complete = _expected(target, tokens, stop)
    drafter = _drafter(kind, draft)
    text, got, pieces, stats = _stream(target, drafter, prompt, stop, N_PLAIN, k)
    assert text == shown and pieces == shown
    assert got == kept == tokens[: len(kept)]
    assert stats.n_tokens == len(kept) and stats.finish == "stop"
    assert target.tokens == (prompt + kept)[:-1]
    # max_tokens reached in the very step the stop string completes: the stop wins.
    text, got, _, stats = _stream(target, _drafter(kind, draft), prompt, stop, complete, k)
    assert (text, got, stats.n_tokens, stats.finish) == (shown, kept, len(kept), "stop")
    assert target.tokens == (prompt + kept)[:-1]
    # One token short of it: no stop string, all the text (its held tail included).
    text, got, _, stats = _stream(target, _drafter(kind, draft), prompt, stop, complete - 1, k)
    assert got == tokens[: complete - 1] and stats.finish == "length"
    assert text == target.detokenize(tokens[: complete - 1])
    assert target.tokens == (prompt + got)[:-1]


def test_decoder_takes_back_tokens_of_earlier_steps(target, plain):
    """Plain decoding yields one token per step, so ' awe' and '-' are already out when 'insp'
    completes the stop string: the last step withdraws them from the text and the cache."""
    prompt, tokens = plain
    shown, kept, complete = _expected(target, tokens, " awe-insp")
    stream = TextStream(target.piece, (" awe-insp",))
    steps = list(generate_steps(target, None, prompt, GREEDY, DecodeConfig(max_tokens=N_PLAIN, k=0), stop=stream.push))
    assert steps[-1].finish == "stop" and steps[-1].withdrawn == 2 and steps[-1].tokens == ()
    out = [t for s in steps for t in s.tokens]
    assert out[: len(out) - 2] == kept and len(steps) == complete
    assert target.tokens == (prompt + kept)[:-1]
