"""OpenAI's harmony chat format (gpt-oss): the prompt renderer and the streaming reply parser.

A harmony conversation is a run of messages `<|start|>{header}<|message|>{body}<|end|>`. The header
holds the author role, optionally ` to={recipient}` (a tool call), `<|channel|>{channel}` and a
content type (` json` or `<|constrain|>json`). A reply is assistant messages on three channels:
`analysis` (the chain of thought: Colibri's reasoning), `commentary` (tool calls, with a recipient
such as `functions.get_weather`; without one, a preamble the user sees) and `final` (the answer).
The model ends its turn with `<|return|>` (done) or `<|call|>` (a tool call waits for its result);
`<|end|>` only closes one message, so it is NOT a stop token.

The renderer writes what gpt-oss's own chat template writes for system/developer/user/assistant/tool
messages (tests compare them); tool *definitions* are left to the model's template. The parser is
fed the reply's text with special tokens kept (decode with skip_special=False) and returns
(reasoning, content) pieces as they stream, holding back a special token split over two pieces.
"""
from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
SPECIALS = (START, END, MESSAGE, CHANNEL, RETURN, CALL, CONSTRAIN)
STOPS = (RETURN, CALL)  # with the vocabulary's <|endoftext|>
# special tokens a decoded reply keeps as text (engine.tokenizer.TextCodec.decode), so that the chat's
# reasoning splitter (app.reasoning) sees where the analysis channel opens and closes and where
# the final channel starts; the stops end the reply and never reach the text
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, "<think>", "</think>")
MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
KNOWLEDGE_CUTOFF = "2024-06"
EFFORTS = ("low", "medium", "high")


def render(messages: list[dict], *, reasoning_effort: str = "medium", current_date: str | None = None,
           model_identity: str | None = None, add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` (dicts with role/content; assistant: optional `thinking` and
    `tool_calls` [{"function": {"name", "arguments"}}]; tool: content is the result)."""
    if reasoning_effort not in EFFORTS:
        raise ValueError(f"reasoning_effort must be one of {', '.join(EFFORTS)}, got {reasoning_effort!r}")
    date = current_date or datetime.date.today().isoformat()
    out = [f"{START}system{MESSAGE}{model_identity or MODEL_IDENTITY}\nKnowledge cutoff: {KNOWLEDGE_CUTOFF}\n"
           f"Current date: {date}\n\nReasoning: {reasoning_effort}\n\n"
           "# Valid channels: analysis, commentary, final. Channel must be included for every message."
           f"{END}"]
    rest = list(messages)
    if rest and rest[0].get("role") in ("system", "developer"):
        dev = rest.pop(0).get("content", "")
        if dev:
            out.append(f"{START}developer{MESSAGE}# Instructions\n\n{dev}\n\n{END}")
    last_call = None
    for i, m in enumerate(rest):
        role, content = m.get("role"), m.get("content") or ""
        if role == "assistant":
            for key in ("content", "thinking"):
                if f"{CHANNEL}analysis{MESSAGE}" in (m.get(key) or "") or f"{CHANNEL}final{MESSAGE}" in (m.get(key) or ""):
                    raise ValueError(f"message {i}: pass the analysis in 'thinking' and the answer in 'content', "
                                     f"not harmony channel tags in {key!r}")
            if m.get("tool_calls"):
                later_final = any(f.get("role") == "assistant" and not f.get("tool_calls") for f in rest[i + 1:])
                call = m["tool_calls"][0].get("function", m["tool_calls"][0])
                cot = m.get("thinking") or content
                if cot and not later_final:
                    out.append(f"{START}assistant{CHANNEL}analysis{MESSAGE}{cot}{END}")
                out.append(f"{START}assistant to=functions.{call['name']}{CHANNEL}commentary "
                           f"{call.get('content_type', 'json')}{MESSAGE}{_json(call.get('arguments'))}{CALL}")
                last_call = call["name"]
            elif i == len(rest) - 1 and not add_generation_prompt:
                if "thinking" in m:
                    out.append(f"{START}assistant{CHANNEL}analysis{MESSAGE}{m['thinking']}{END}")
                out.append(f"{START}assistant{CHANNEL}final{MESSAGE}{content}{RETURN}")
            else:  # earlier turns: the chain of thought is dropped
                out.append(f"{START}assistant{CHANNEL}final{MESSAGE}{content}{END}")
                last_call = None
        elif role == "tool":
            if last_call is None:
                raise ValueError(f"message {i}: a tool result with no assistant tool call before it")
            out.append(f"{START}functions.{last_call} to=assistant{CHANNEL}commentary{MESSAGE}{_json(content)}{END}")
        elif role == "user":
            out.append(f"{START}user{MESSAGE}{content}{END}")
        else:
            raise ValueError(f"message {i}: role {role!r} is not one of system, developer, user, assistant, tool "
                             "(system/developer only first)")
    if add_generation_prompt:
        out.append(f"{START}assistant")
    return "".join(out)


def _json(value) -> str:
    """What transformers' chat-template `tojson` writes (keys in order, non-ASCII kept, no HTML
    escapes), the form gpt-oss was trained on; Jinja's own tojson sorts keys and escapes <>&'."""
    return json.dumps(value, ensure_ascii=False)


@dataclass
class Message:
    """One parsed harmony message of the reply."""
    role: str = "assistant"
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None
    text: str = ""
    complete: bool = False


@dataclass
class ToolCall:
    recipient: str  # e.g. "functions.get_weather"
    arguments: str  # the raw text (json for content type json)
    content_type: str | None = None


@dataclass
class HarmonyParser:
    """Streams a reply: push(text) -> (reasoning, content). The reply starts inside a header (the
    prompt ended with `<|start|>assistant`). After `<|return|>` or `<|call|>`, `done` is set."""
    messages: list[Message] = field(default_factory=list)
    done: bool = False
    stop: str | None = None
    _state: str = "header"
    _buf: str = ""
    _prefix: str = "assistant "  # the prompt's `<|start|>assistant`: the reply's header starts after it
    _header: str = "assistant "

    def push(self, piece: str) -> tuple[str, str]:
        out = ["", ""]
        self._buf += piece
        while self._buf and not self.done:
            i, tok = self._next_special()
            if i < 0:
                hold = self._partial_tail()
                self._text(self._buf[:len(self._buf) - hold], out)
                self._buf = self._buf[len(self._buf) - hold:]
                break
            self._text(self._buf[:i], out)
            self._buf = self._buf[i + len(tok):]
            self._special(tok, out)
        return out[0], out[1]

    def flush(self) -> tuple[str, str]:
        out = ["", ""]
        if not self.done:  # text after <|return|> / <|call|> is not part of the reply
            self._text(self._buf, out)
        self._buf = ""
        if self._state == "header" and not self.done and self._rest().strip() and CHANNEL not in self._header:
            self._plain(out)
        if self.messages and self._state == "body":
            self.messages[-1].complete = True
        return out[0], out[1]

    @property
    def calls(self) -> list[ToolCall]:
        return [ToolCall(m.recipient, m.text, m.content_type) for m in self.messages if m.recipient]

    @property
    def reasoning(self) -> str:
        return "".join(m.text for m in self.messages if m.channel == "analysis")

    @property
    def content(self) -> str:
        return "".join(m.text for m in self.messages if _visible(m))

    def _next_special(self) -> tuple[int, str]:
        hits = [(self._buf.find(t), t) for t in SPECIALS if t in self._buf]
        return min(hits) if hits else (-1, "")

    def _partial_tail(self) -> int:
        for k in range(min(len(self._buf), max(map(len, SPECIALS)) - 1), 0, -1):
            if any(t.startswith(self._buf[-k:]) for t in SPECIALS):
                return k
        return 0

    def _text(self, text: str, out: list[str]) -> None:
        if not text:
            return
        if self._state == "header":
            self._header += text
            if self._not_a_header():
                self._plain(out)
        elif self._state == "body":
            m = self.messages[-1]
            m.text += text
            if m.channel == "analysis":
                out[0] += text
            elif _visible(m):
                out[1] += text
        elif text.strip():  # text outside any message: lenient, shown as content
            self.messages.append(Message(channel="final", text=text))
            out[1] += text

    def _rest(self) -> str:
        """The header after its role."""
        if self._prefix:
            return self._header[len(self._prefix):]
        role, _, rest = self._header.partition(" ")
        return rest

    def _not_a_header(self) -> bool:
        """Text where a header should be that cannot be one (a model answering without harmony
        markers): after the role, anything but ` to=...` once 4 characters have come."""
        rest = self._rest().lstrip(" ")
        return CHANNEL not in self._header and len(rest) >= 4 and not rest.startswith("to=")

    def _plain(self, out: list[str]) -> None:
        text = self._header[len(self._prefix):] if self._prefix else self._header
        self.messages.append(Message(channel="final", text=text))
        self._state = "body"
        out[1] += text

    def _special(self, tok: str, out: list[str]) -> None:
        if tok == MESSAGE and self._state == "header":
            self.messages.append(_header(self._header))
            self._state = "body"
        elif tok in (END, RETURN, CALL):
            if self.messages and self._state == "body":
                self.messages[-1].complete = True
            self._state = "between"
            if tok != END:
                self.done, self.stop = True, tok
        elif tok == START:
            self._state, self._header, self._prefix = "header", "", ""
        elif self._state == "header":  # <|channel|> / <|constrain|> inside a header
            self._header += tok
        elif self._state == "between" and tok == CHANNEL:  # a message without its <|start|>assistant
            self._state, self._header, self._prefix = "header", "assistant " + tok, "assistant "
        elif self._state == "body":  # a stray header token inside a body: kept as text
            self._text(tok, out)


def _visible(m: Message) -> bool:
    return m.channel == "final" or (m.channel in ("commentary", None) and not m.recipient)


def _header(text: str) -> Message:
    """`assistant to=functions.f<|channel|>commentary <|constrain|>json` -> its fields."""
    head, _, chan = text.partition(CHANNEL)
    words = head.split()
    msg = Message(role=words.pop(0) if words else "assistant")
    after = chan.replace(CONSTRAIN, " ").split()
    if after:
        msg.channel = after.pop(0)
    for w in words + after:
        if w.startswith("to="):
            msg.recipient = w[3:]
        else:
            msg.content_type = w
    return msg


def parse(text: str) -> list[Message]:
    """A whole reply (special tokens kept) -> its messages."""
    p = HarmonyParser()
    p.push(text)
    p.flush()
    return p.messages
