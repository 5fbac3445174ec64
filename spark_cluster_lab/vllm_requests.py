"""What the test double reads of a completion or chat request, and how it refuses one: vLLM's
messages, codes and error types.
"""

from __future__ import annotations

from typing import Any

from spark_cluster_lab.vllm_rate import count_tokens


class ApiError(Exception):
    """A refusal, as vLLM sends it: the HTTP status, the message, its type and the parameter at fault."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


def prompt_of(req: dict[str, Any], chat: bool) -> tuple[str, int]:
    """The prompt's text (the filler's seed) and its token count."""
    if chat:
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad("messages: Field required" if messages is None else "messages must be a non-empty list",
                      "messages")
        parts: list[str] = []
        for msg in messages:
            if not isinstance(msg, dict) or "role" not in msg:
                raise bad("each message needs a role", "messages")
            content = msg.get("content") or ""
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(str(content))
        text = "\n".join(parts)
        return text, max(1, count_tokens(text))
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, max(1, count_tokens(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return " ".join(map(str, prompt)), len(prompt)
    if prompt is None:
        raise bad("prompt: Field required", "prompt")
    raise bad("the vLLM double takes one prompt per request (a string or a list of token ids)", "prompt")


def limits(req: dict[str, Any], chat: bool, prompt_tokens: int, max_model_len: int,
           answer_tokens: int) -> tuple[int, str]:
    """How many tokens to generate and the finish reason they end with."""
    if prompt_tokens > max_model_len:
        raise bad(f"This model's maximum context length is {max_model_len} tokens. However, your request "
                  f"has {prompt_tokens} input tokens. Please reduce the length of the input messages.")
    asked = req.get("max_completion_tokens") if chat else None
    if asked is None:
        asked = req.get("max_tokens")
    if asked is None:
        if chat:
            return min(answer_tokens, max_model_len - prompt_tokens), "stop"
        asked = 16
    if not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
        raise bad(f"max_tokens must be at least 1, got {asked}.", "max_tokens")
    if asked > max_model_len - prompt_tokens:
        raise bad(f"'max_tokens' or 'max_completion_tokens' is too large: {asked}. This model's maximum "
                  f"context length is {max_model_len} tokens and your request has {prompt_tokens} input "
                  f"tokens ({asked} > {max_model_len} - {prompt_tokens}).", "max_tokens")
    return asked, "length"
