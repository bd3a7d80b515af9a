"""A checked request's prompt tokens (run off the event loop: a template over thousands of
messages takes seconds), and its sampling settings once the target is known: a forced tool call's
grammar depends on the format the target's chat template writes calls in."""

from __future__ import annotations

from dataclasses import replace

from localspec.engine.grammar import GrammarError
from localspec.tokens import prompt_fits
from .api import check_with, too_long
from .errors import ApiError
from .tools import call_format, call_grammar, template_messages


def prompt_tokens(target, n_ctx: int, req):
    """(tokens, sampling) of `req` (an api.Request) on `target`; an ApiError when it cannot be."""
    sampling = req.sampling
    if req.chat:
        template = target.chat_template
        if template is None:
            raise ApiError(f"{target.name} has no chat template; use /v1/completions with a raw prompt",
                           param="messages", code="no_chat_template")
        messages, tools = template_messages(req.messages, req.tools, template)
        try:
            tokens = target.chat_prompt(messages, tools)
        except Exception as e:  # the template's own checks (roles must alternate…)
            raise ApiError(f"the chat template refused these messages: {e}", param="messages",
                           code="invalid_value") from None
        if req.tools is not None and req.tools.constrained:
            try:
                grammar = call_grammar(req.tools, call_format(template))
            except GrammarError as e:
                raise ApiError(f"tools: {e}", param="tools", code="invalid_value") from None
            sampling = replace(sampling, grammar=grammar, grammar_name="tool call")
    elif isinstance(req.prompt, str):
        try:
            tokens = target.tokenize(req.prompt, add_special=True, parse_special=True)
        except UnicodeEncodeError:
            raise ApiError("the prompt is not valid Unicode (a lone surrogate?)", param="prompt",
                           code="invalid_value") from None
    else:
        tokens = list(req.prompt)
        if max(tokens) >= target.n_vocab:
            raise ApiError(f"token id {max(tokens)} is outside the vocabulary ({target.n_vocab} ids)",
                           param="prompt", code="invalid_value")
    if not tokens:
        raise ApiError("the prompt is empty", param="prompt", code="invalid_value")
    if not prompt_fits(len(tokens), n_ctx):
        raise too_long(len(tokens), n_ctx, req.chat)
    check_with(sampling, target)
    return tokens, sampling
