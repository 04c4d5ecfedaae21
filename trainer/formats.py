"""Dataset adapters: ShareGPT, OpenAI messages, UltraChat, instruction pairs, agent trajectories
-> schema messages (`trainer.schema`). Each adapter raises ValueError on a malformed record.
"""

from __future__ import annotations

import json

from trainer.reasoning import DEFAULT_TAGS, ThinkTags, split_reasoning

ROLE_ALIASES = {
    "system": "system", "developer": "system",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "model": "assistant",
    "bard": "assistant", "bing": "assistant", "ai": "assistant", "agent": "assistant",
    "tool": "tool", "function": "tool", "observation": "tool", "function_response": "tool",
    "ipython": "tool", "environment": "tool", "env": "tool",
}
FUNCTION_CALL_ROLES = {"function_call", "tool_call", "action"}
SOURCE_ID_FIELDS = ("id", "conversation_id", "prompt_id", "uuid", "idx")


def _text(content, where: str) -> str:
    """Content as one string: str, None, or a list of OpenAI text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where}: unsupported content part {kind!r} (only text is supported)")
        return "".join(texts)
    raise ValueError(f"{where}: content must be a string or a list of text parts, got {type(content).__name__}")


def _arguments(args):
    """Tool-call arguments as a dict when they are a JSON object (what chat templates expect)."""
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            return args
        return parsed if isinstance(parsed, dict) else args
    return {} if args is None else args


def _tool_calls(calls, where: str) -> list[dict]:
    if isinstance(calls, dict):
        calls = [calls]
    if not isinstance(calls, list):
        raise ValueError(f"{where}: tool_calls must be a list")
    out = []
    for n, call in enumerate(calls):
        if not isinstance(call, dict):
            raise ValueError(f"{where}: tool_calls[{n}] must be an object")
        fn = call.get("function", call)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"{where}: tool_calls[{n}] has no function name")
        out.append({"id": str(call.get("id") or f"call_{n}"), "type": "function",
                    "function": {"name": fn["name"],
                                 "arguments": _arguments(fn.get("arguments", fn.get("parameters")))}})
    return out


def _message(role: str, content: str, *, reasoning=None, tool_calls=None, tool_call_id=None, name=None,
             tags: ThinkTags = DEFAULT_TAGS) -> dict:
    if role == "assistant" and reasoning is None:
        reasoning, content = split_reasoning(content, tags)  # inline <think>...</think> in the content
    msg = {"role": role, "content": content}
    if role == "assistant" and reasoning is not None:
        msg["reasoning_content"] = reasoning
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if tool_call_id is not None:
        msg["tool_call_id"] = str(tool_call_id)
    if name is not None and role == "tool":
        msg["name"] = str(name)
    return msg


def _role(raw, where: str) -> str:
    role = ROLE_ALIASES.get(str(raw).lower()) if raw is not None else None
    if role is None:
        raise ValueError(f"{where}: unknown role {raw!r}")
    return role


def _turns(items, where: str, tags: ThinkTags) -> list[dict]:
    """Generic turn list: role|from|type, content|value|text, reasoning fields, tool calls."""
    if not isinstance(items, list) or not items:
        raise ValueError(f"{where}: expected a non-empty list of turns")
    messages: list[dict] = []
    for n, item in enumerate(items):
        at = f"{where}[{n}]"
        if not isinstance(item, dict):
            raise ValueError(f"{at}: a turn must be an object, got {type(item).__name__}")
        raw_role = item.get("role", item.get("from", item.get("type")))
        body = item.get("content", item.get("value", item.get("text")))
        if str(raw_role).lower() in FUNCTION_CALL_ROLES:
            payload = body
            if isinstance(body, str):
                try:
                    payload = json.loads(body)
                except json.JSONDecodeError:
                    raise ValueError(f"{at}: a {raw_role} turn must hold JSON with name/arguments") from None
            call_list = _tool_calls(payload, at)
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and "tool_calls" not in last:
                last["tool_calls"] = call_list
            else:
                messages.append(_message("assistant", "", tool_calls=call_list, tags=tags))
            continue
        role = _role(raw_role, at)
        reasoning = next((item[k] for k in ("reasoning_content", "reasoning", "thinking", "thought")
                          if isinstance(item.get(k), str)), None)
        calls = item.get("tool_calls") or item.get("function_call")
        messages.append(_message(
            role, _text(body, at), reasoning=reasoning,
            tool_calls=_tool_calls(calls, at) if calls and role == "assistant" else None,
            tool_call_id=item.get("tool_call_id") if role == "tool" else None,
            name=item.get("name") if role == "tool" else None, tags=tags))
    return messages


def _with_system(rec: dict, messages: list[dict]) -> list[dict]:
    system = rec.get("system") or rec.get("system_prompt")
    if isinstance(system, str) and system and not any(m["role"] == "system" for m in messages):
        return [{"role": "system", "content": system}] + messages
    return messages


def sharegpt(rec: dict, tags: ThinkTags = DEFAULT_TAGS) -> list[dict]:
    return _with_system(rec, _turns(rec["conversations"], "conversations", tags))


def openai(rec: dict, tags: ThinkTags = DEFAULT_TAGS) -> list[dict]:
    return _with_system(rec, _turns(rec["messages"], "messages", tags))


def ultrachat(rec: dict, tags: ThinkTags = DEFAULT_TAGS) -> list[dict]:
    if "data" not in rec:
        return openai(rec, tags)
    data = rec["data"]
    if not isinstance(data, list) or not data or not all(isinstance(x, str) for x in data):
        raise ValueError("data: expected a non-empty list of strings (alternating user/assistant)")
    return [_message("user" if i % 2 == 0 else "assistant", text, tags=tags) for i, text in enumerate(data)]


def instruction(rec: dict, tags: ThinkTags = DEFAULT_TAGS) -> list[dict]:
    prompt = rec.get("instruction", rec.get("prompt"))
    if not isinstance(prompt, str):
        raise ValueError("instruction/prompt must be a string")
    extra = rec.get("input")
    if isinstance(extra, str) and extra.strip():
        prompt = f"{prompt}\n\n{extra}"
    messages = _with_system(rec, [{"role": "user", "content": prompt}])
    answer = next((rec[k] for k in ("output", "response", "completion") if rec.get(k) is not None), None)
    if answer is not None:
        reasoning = rec.get("reasoning_content", rec.get("reasoning"))
        messages.append(_message("assistant", _text(answer, "output"),
                                 reasoning=reasoning if isinstance(reasoning, str) else None, tags=tags))
    return messages


AGENT_KEYS = ("trajectory", "steps", "messages", "conversations")


def agent(rec: dict, tags: ThinkTags = DEFAULT_TAGS) -> list[dict]:
    key = next(k for k in AGENT_KEYS if k in rec)
    return _with_system(rec, _turns(rec[key], key, tags))

# name -> (adapter, the fields that identify it: any of these groups present)
ADAPTERS = {
    "sharegpt": (sharegpt, [("conversations",)]),
    "openai": (openai, [("messages",)]),
    "ultrachat": (ultrachat, [("data",), ("messages",)]),
    "instruction": (instruction, [("instruction",), ("prompt",)]),
    "agent": (agent, [(k,) for k in AGENT_KEYS]),
}
AUTO_ORDER = ("sharegpt", "openai", "ultrachat", "instruction", "agent")
EXPECTED = "conversations|messages|data|instruction/output|prompt/response|trajectory|steps"


def matches(name: str, rec: dict) -> bool:
    return any(all(k in rec for k in group) for group in ADAPTERS[name][1])


def detect(rec: dict) -> str | None:
    """The adapter for a record in auto mode (None when no adapter matches)."""
    return next((name for name in AUTO_ORDER if matches(name, rec)), None)


def source_id(rec: dict) -> str | None:
    value = next((rec[k] for k in SOURCE_ID_FIELDS if rec.get(k) not in (None, "")), None)
    return None if value is None else str(value)


def tools_of(rec: dict):
    tools = rec.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            return None
    return tools if isinstance(tools, list) and tools else None
