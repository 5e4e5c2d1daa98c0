"""The tokenizer as the engine uses it: data encoding, template encoding, and the chat template.

Only the chat template's own text may become special (control) tokens. Everything a user or a
retriever supplies -- chunk texts, questions, system prompts, message contents, flat prompts -- is
data: ``encode`` tokenizes it with special-token parsing off, so ``"<|im_end|>"`` inside a document
becomes the ordinary tokens of those characters and cannot forge a chat turn. ``encode_template``
is the one place special tokens are parsed, and it only ever sees template text: chats are rendered
with placeholders in place of the message contents (``chat_parts``), so template text and contents
are tokenized separately.

Segments never get special tokens added implicitly, so a chunk's token ids are the same at
ingestion and at query time (both go through ``encode``).
"""

from __future__ import annotations

import bisect
import json
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate, chain
from operator import itemgetter
from typing import Any, Callable, Sequence

from fusionrag_llm.errors import FusionRAGError

# ChatML, used when a tokenizer ships without a template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def content_placeholder(index: int) -> str:
    """What the template renders in place of ``messages[index]``'s content.

    Contents never enter the rendered string, so a content that contains a placeholder changes
    nothing; the NUL bytes only keep placeholders apart from the template's own text.
    """
    return f"\x00FUSIONRAG_CONTENT_{index}\x00"


@dataclass(frozen=True)
class ChatPart:
    """A piece of a rendered chat: the template's own text, or one message's content (data)."""

    text: str
    message: int | None = None  # index of the message whose content this is; None: template text


class TokenizedText:
    """A text's data token ids and where its token boundaries fall.

    ``index_at(char)`` is the ``k`` with ``ids[:k]`` covering exactly ``text[:char]``, or None when
    ``char`` falls inside a token. It reads the tokenizer's offset mapping when there is one, else
    it decodes prefixes of ``ids`` (slow tokenizers); where neither is certain it says None, which
    only costs a missed chunk, never a changed prompt.
    """

    def __init__(self, text: str, ids: Sequence[int], offsets: Sequence[tuple[int, int]] | _Spans | None,
                 decode: Callable[[Sequence[int]], str]):  # fmt: skip
        self.text = text
        self.ids = list(ids)
        self._offsets = offsets
        self._decode = decode

    def decode(self, ids: Sequence[int]) -> str:
        """``ids`` as text, exactly (special tokens kept, no clean-up of spaces)."""
        return self._decode(ids)

    def index_at(self, char: int) -> int | None:
        if self._by_char is not None:
            return self._by_char.get(char)
        return self._index_by_decoding(char)

    @cached_property
    def _by_char(self) -> _OffsetBoundaries | None:
        return None if self._offsets is None else _OffsetBoundaries(self._offsets, len(self.text))

    def _index_by_decoding(self, char: int) -> int | None:
        prefix_len = _LazyPrefixLengths(self.ids, self._decode)
        k = bisect.bisect_left(prefix_len, char)  # decoded prefixes grow with k
        return k if k <= len(self.ids) and self._decode(self.ids[:k]) == self.text[:char] else None


class _LazyPrefixLengths:
    """``[len(decode(ids[:k])) for k in 0..n]`` computed only where a bisection looks."""

    def __init__(self, ids: list[int], decode: Callable[[Sequence[int]], str]):
        self.ids, self.decode = ids, decode

    def __len__(self) -> int:
        return len(self.ids) + 1

    def __getitem__(self, k: int) -> int:
        return len(self.decode(self.ids[:k]))


@dataclass(frozen=True)
class _Spans:
    """A text's token offsets as two lists, every token's start and every token's end: what ``tokenize``
    builds for a text cut in pieces, without a tuple per token."""

    starts: list[int]
    ends: list[int]


class _OffsetBoundaries:
    """``index_at`` from an offset mapping: the smallest k with every token before k ending at or before
    ``char`` and every token from k on starting at or after it (the least start of tokens k.. and the
    greatest end of tokens ..k-1 are both non-decreasing in k, so two bisections find it).

    Bytes of one character share its span, so a character split across tokens is never a boundary.
    """

    def __init__(self, offsets: Sequence[tuple[int, int]] | _Spans, length: int):
        if isinstance(offsets, _Spans):
            starts, ends = [*offsets.starts, length], [0, *offsets.ends]
        else:
            starts, ends = [*map(itemgetter(0), offsets), length], [0, *map(itemgetter(1), offsets)]
        # [k]: the least start of tokens k.. (and the text's end), the greatest end of tokens ..k-1; for
        # the usual map, whose starts and ends never go back, the lists themselves
        self.min_start = starts if starts == sorted(starts) else [*accumulate(reversed(starts), min)][::-1]
        self.max_end = ends if ends == sorted(ends) else [*accumulate(ends, max)]

    def get(self, char: int) -> int | None:
        k = bisect.bisect_left(self.min_start, char)
        return k if k < len(self.min_start) and self.max_end[k] <= char else None


ENCODED_BYTES = 32 << 20  # what the memo of encoded texts may hold: their characters and 4 bytes per id


class EncodedTexts:
    """Data texts encoded recently, their ids and (for ``tokenize``'s pieces) their offsets, so that a
    chunk retrieved again is not tokenized again (at 32k tokens of passages, ~20 ms of every request's
    host work with SmolLM2's tokenizer, ~35 ms for one chat message). Texts are kept per ``scope`` (the
    engine's tenant), so how fast one tenant's request is split never tells whether another tenant's
    text was seen. The least recently used are dropped once the texts, ids and offsets held pass
    ``budget`` bytes (4 per id and per offset bound, 1 per character; a text larger than that is not kept).
    """

    def __init__(self, budget: int = ENCODED_BYTES) -> None:
        self.budget = budget
        self.held = 0  # bytes held, counted as above
        self._texts: OrderedDict[tuple[str, str], tuple[array, array | None]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._texts)

    def get(self, scope: str, text: str, offsets: bool = False) -> tuple[array, array | None] | None:
        """``text``'s ids and flat offsets (start, end, start, ...; None unless kept), or None where it is
        not kept (or, with ``offsets``, kept without them)."""
        with self._lock:
            found = self._texts.get((scope, text))
            if found is None or (offsets and found[1] is None):
                return None
            self._texts.move_to_end((scope, text))
        return found

    def cached(self, scope: str, texts: Sequence[str], offsets: bool, encode) -> list[tuple[array, array | None]]:
        """Every text's ids and flat offsets (as ``get`` gives them): from memory where kept, the others from
        one call of ``encode(missing texts)`` (their ``(ids, offsets or None)`` pairs, in order), kept."""
        found = [self.get(scope, text, offsets) for text in texts]
        missing = [text for text, known in zip(texts, found) if known is None]
        made = iter(encode(missing) if missing else ())
        return [known if known is not None else self.put(scope, text, *next(made)) for text, known in zip(texts, found)]

    def put(self, scope: str, text: str, ids: Sequence[int],
            offsets: Sequence[tuple[int, int]] | None = None) -> tuple[array, array | None]:  # fmt: skip
        """Keep ``text``'s ids (and offsets); returns them as ``get`` would."""
        kept = (array("I", ids), None if offsets is None else array("I", chain.from_iterable(offsets)))
        size = _held(text, kept)
        if size > self.budget:
            return kept
        with self._lock:
            old = self._texts.pop((scope, text), None)
            self.held += size - (0 if old is None else _held(text, old))
            self._texts[(scope, text)] = kept
            while self.held > self.budget:
                (_, dropped), value = self._texts.popitem(last=False)
                self.held -= _held(dropped, value)
        return kept


def _held(text: str, kept: tuple[array, array | None]) -> int:
    return len(text) + 4 * (len(kept[0]) + (0 if kept[1] is None else len(kept[1])))


class ChatTokenizer:
    """Wraps a `transformers` tokenizer; ``hf`` stays reachable for framework adapters."""

    def __init__(self, hf: Any, extra_stop_ids: Sequence[int] = ()):
        self.hf = hf
        if not getattr(hf, "chat_template", None):
            hf.chat_template = CHATML_TEMPLATE
        stop = set(extra_stop_ids)
        for token in (hf.eos_token, "<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            token_id = hf.convert_tokens_to_ids(token) if token else None
            if token_id is not None and token_id != hf.unk_token_id:
                stop.add(int(token_id))
        self.stop_ids = frozenset(stop)
        self._data_backend = _data_backend(hf)
        self._cuttable = self._data_backend is not None and _splits_as_gpt2(self._data_backend)
        self._tool_formats: dict[str, Any] = {}  # chat template -> its tool format (or None)
        self.encoded = EncodedTexts()  # texts (and long texts' pieces) encoded lately, per tenant

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        """Data ids of ``text``: special-token text such as ``"<|im_end|>"`` becomes ordinary tokens.

        >>> from fusionrag_llm.models.tiny import byte_tokenizer
        >>> ChatTokenizer(byte_tokenizer()).encode("<|im_end|>")[:3]  # the bytes '<', '|', 'i'
        [60, 124, 105]
        """
        check_text(text)
        if self._data_backend is not None:
            return list(self._data_backend.encode(text, add_special_tokens=False).ids)
        return list(self.hf.encode(text, add_special_tokens=False, split_special_tokens=True))

    def encode_many(self, texts: Sequence[str], scope: str = "") -> list[list[int]]:
        """``encode`` of each text: those encoded lately in ``scope`` (a tenant) from memory (``encoded``), the
        others in one call (the tokenizer's threads share them)."""
        for text in texts:
            check_text(text)

        def encode(missing: list[str]) -> list[tuple[list[int], None]]:
            if self._data_backend is not None:
                return [(e.ids, None) for e in self._data_backend.encode_batch(missing, add_special_tokens=False)]
            return [(self.encode(text), None) for text in missing]

        return [ids.tolist() for ids, _ in self.encoded.cached(scope, texts, False, encode)]

    def tokenize(self, text: str, scope: str = "") -> TokenizedText:
        """``encode`` that also knows where its token boundaries fall (for finding chunks in prompts).

        A long text is tokenized in pieces where the tokenizer splits text as GPT-2's byte-level rule does
        and nothing runs before that split (``_cut_points``): the same ids. Its pieces are about paragraphs,
        so a passage sent again (after the same separator) is a piece encoded before: those come from
        memory (``encoded``, per ``scope``, a tenant), the others from one batch call."""
        if self._data_backend is None:
            return TokenizedText(text, self.encode(text), None, self._decode_exact)
        check_text(text)  # the other path's ``encode`` checks it
        cuts = _cut_points(text) if self._cuttable else []
        if not cuts:
            encoding = self._data_backend.encode(text, add_special_tokens=False)
            return TokenizedText(text, encoding.ids, encoding.offsets, self._decode_exact)
        starts = [0, *cuts]
        pieces = [text[a:b] for a, b in zip(starts, [*cuts, len(text)])]
        def encode(missing: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
            # each read of an encoding's field makes a new list: read once
            return [(e.ids, e.offsets) for e in self._data_backend.encode_batch(missing, add_special_tokens=False)]

        ids: list[int] = []
        spans = _Spans([], [])
        for at, (piece_ids, bounds) in zip(starts, self.encoded.cached(scope, pieces, True, encode)):
            ids += piece_ids.tolist()
            spans.starts.extend(map(at.__add__, bounds[::2]))
            spans.ends.extend(map(at.__add__, bounds[1::2]))
        return TokenizedText(text, ids, spans, self._decode_exact)

    def encode_template(self, text: str) -> list[int]:
        """Ids of the chat template's own text, special tokens parsed; never pass user or retrieved text."""
        return list(self.hf.encode(text, add_special_tokens=False, split_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _decode_exact(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, tools: Sequence[dict] | None = None) -> str:
        """The chat as one string, contents verbatim: for display, not for tokenizing (see ``chat_parts``).
        ``tools``: OpenAI tool dicts, for a template that lists them (``tool_format``)."""
        extra = {"tools": list(tools)} if tools else {}
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra)

    @property
    def tool_format(self) -> Any:
        """How the chat template writes tool calls (``tool_calls.ToolFormat``), or None when it has no tool
        format of its own (then tools are offered through the generic tool prompt)."""
        from fusionrag_llm.tool_calls import infer_tool_format

        template = self.hf.chat_template
        if template not in self._tool_formats:
            self._tool_formats[template] = infer_tool_format(
                lambda messages, tools, prompt: self.render_chat(messages, prompt, tools))
        return self._tool_formats[template]

    def chat_parts(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[ChatPart]:
        """The rendered chat as template text and message contents, in order.

        The template is rendered with ``content_placeholder(i)`` in place of each content, so no
        content can add or close a turn. Templates that branch on a content's text (e.g. on a
        ``</think>`` inside it) see the placeholder instead.
        """
        return self._split_rendered(self._render_placeholders(messages, add_generation_prompt), messages)

    def chat_frame(self, system: str | None) -> tuple[list[ChatPart], list[ChatPart]]:
        """Parts before and after one user message (with the given or the template's default system prompt)."""
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages.append({"role": "user", "content": ""})
        parts = self.chat_parts(messages)
        user = next(i for i, part in enumerate(parts) if part.message == len(messages) - 1)
        return parts[:user], parts[user + 1 :]

    def split_generation_prompt(self, messages: list[dict], tools: Sequence[dict] | None = None,
                                ) -> tuple[list[ChatPart], list[ChatPart]]:  # fmt: skip
        """The chat's parts without its generation prompt (e.g. ``<|im_start|>assistant``), and that prompt.
        ``tools``: listed by the template (``tool_format``); messages may then hold calls and results."""
        with_prompt = self._render_placeholders(messages, True, tools)
        without = self._render_placeholders(messages, False, tools)
        if with_prompt.startswith(without) and len(with_prompt) > len(without):
            return self._split_rendered(without, messages), [ChatPart(with_prompt[len(without) :])]
        # A template without a generation prompt: the last message onwards is the suffix.
        parts = self._split_rendered(with_prompt, messages)
        last = next(i for i, part in enumerate(parts) if part.message == len(messages) - 1)
        return parts[:last], parts[last:]

    def _render_placeholders(self, messages: list[dict], add_generation_prompt: bool, tools: Sequence[dict] | None = None) -> str:
        """The chat rendered with placeholders for the contents. Tools, calls and tool names are rendered by
        the template itself: they must not hold the text of a control token."""
        stand_ins = [{**m, "content": content_placeholder(i)} for i, m in enumerate(messages)]
        if tools or any(len(m) > 2 for m in messages):
            self._check_template_data([tools, [{k: v for k, v in m.items() if k not in ("role", "content")} for m in messages]])
        return self.render_chat(stand_ins, add_generation_prompt, tools)

    def _check_template_data(self, value: Any) -> None:
        """Refuse what the template renders as its own text (tools, calls) when it holds a control token's text."""
        text = json.dumps(value, ensure_ascii=False)
        for token in self._control_texts:
            if token in text:
                raise FusionRAGError(f"tool definitions and calls must not contain the model's control token {token!r}")

    @cached_property
    def _control_texts(self) -> tuple[str, ...]:
        """The texts of the tokenizer's special tokens (what template text turns into control tokens)."""
        special = [*self.hf.all_special_tokens, *(t.content for t in self.hf.added_tokens_decoder.values() if t.special)]
        return tuple(dict.fromkeys(token for token in special if token))

    def _split_rendered(self, rendered: str, messages: list[dict[str, str]]) -> list[ChatPart]:
        parts, rest = [], rendered
        for index, message in enumerate(messages):
            if message.get("tool_calls") and not message["content"] and content_placeholder(index) not in rest:
                continue  # a call without text, whose content the template leaves out
            before, found, rest = rest.partition(content_placeholder(index))
            if not found or content_placeholder(index) in rest:
                raise FusionRAGError(
                    f"the chat template dropped, repeated or reordered messages[{index}] (role {message['role']!r}); "
                    "FusionRAG needs each message content exactly once, in order"
                )
            content = message["content"].strip() if self._trims_contents else message["content"]
            parts += [ChatPart(before), ChatPart(content, index)]
        parts.append(ChatPart(rest))
        return [part for part in parts if part.text or part.message is not None]

    @cached_property
    def _trims_contents(self) -> bool:
        """Whether the template strips whitespace around contents (e.g. Llama 3's ``| trim``)."""
        padded = " " + content_placeholder(0) + " "
        return padded not in self.render_chat([{"role": "user", "content": padded}])


def check_text(text: str) -> None:
    """Refuse text that is not valid Unicode (a lone surrogate such as ``"\\ud800"``, which JSON and
    Python strings can carry but no tokenizer can encode) with the position of the first bad character.

    >>> check_text("caf\\u00e9")
    >>> check_text("a\\ud800b")
    Traceback (most recent call last):
    ...
    fusionrag_llm.errors.FusionRAGError: text is not valid Unicode: a lone surrogate U+D800 at character 1; send UTF-8 text
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = ord(text[exc.start])
        raise FusionRAGError(f"text is not valid Unicode: a lone surrogate U+{bad:04X} at character {exc.start}; "
                             "send UTF-8 text") from None  # fmt: skip


CUT_CHARS = 8192  # a data text longer than this is tokenized in pieces (``tokenize``)
PIECE_CHARS = 256  # of at least this many characters, cut at every line break the rule allows after that


def _splits_as_gpt2(backend: Any) -> bool:
    """Whether ``backend`` (a data backend: special tokens stay text) splits text before its BPE exactly
    by GPT-2's byte-level rule, with nothing before that (no normalizer, no added token taken out of data)
    and nothing random after (``_cut_points`` relies on it)."""
    from tokenizers import models, pre_tokenizers

    pre, model = backend.pre_tokenizer, backend.model
    return (backend.normalizer is None and isinstance(pre, pre_tokenizers.ByteLevel) and pre.use_regex
            and not pre.add_prefix_space and isinstance(model, models.BPE) and model.dropout is None
            and all(token.special for token in backend.get_added_tokens_decoder().values()))  # fmt: skip


def _cut_points(text: str) -> list[int]:
    """Where a text longer than CUT_CHARS is cut: pieces of at least PIECE_CHARS characters, each ending at
    a place where ``text`` tokenizes piece by piece as it does whole under GPT-2's byte-level split: a line
    break right after a printable ASCII character that is not a space. The rule's every alternative that
    takes that character stops before a line break (a run of letters, of digits, of other signs, a
    contraction), so a split unit ends there; the next one starts at the line break whatever came before
    (the rule looks behind nothing), and BPE runs within units. A passage set off by line breaks is so
    mostly a piece of its own, the same in every text that holds it after the same separator.
    """
    if len(text) <= CUT_CHARS:
        return []
    cuts, at = [], PIECE_CHARS
    while at < len(text):
        cut = text.find("\n", at)
        while cut > 0 and not "!" <= text[cut - 1] <= "~":
            cut = text.find("\n", cut + 1)
        if cut <= 0 or cut >= len(text) - 1:
            break
        cuts.append(cut)
        at = cut + PIECE_CHARS
    return cuts


def _data_backend(hf: Any) -> Any | None:
    """A private copy of a fast tokenizer's backend that never parses special tokens.

    A copy, because `transformers` switches special-token parsing by setting a flag on the shared
    backend per call; two threads encoding data and template text at once could otherwise see each
    other's setting. Slow tokenizers take the setting per call and need no copy (None).
    """
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(backend.to_str())
    copy.encode_special_tokens = True
    probe = "Data, not control: <|im_end|>\n<|im_start|>assistant\n  é"
    expected = hf.encode(probe, add_special_tokens=False, split_special_tokens=True)
    if copy.encode(probe, add_special_tokens=False).ids != expected:
        return None  # the wrapper preprocesses text itself; go through it (no offsets then)
    return copy
