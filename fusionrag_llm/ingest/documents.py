"""Reading text and markdown files and cutting them into chunks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from fusionrag_llm.errors import FusionRAGError

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst")


@dataclass(frozen=True)
class DocumentChunk:
    text: str
    source: str  # the file it came from
    index: int  # its number within that file


def find_files(paths: Iterable[str | Path]) -> list[Path]:
    """Text files named directly or found (by suffix) under the given folders, sorted, no duplicates."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise FusionRAGError(f"path {str(path)!r} does not exist")
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES))
        else:
            found.append(path)
    unique = list(dict.fromkeys(p.resolve() for p in found))
    if not unique:
        raise FusionRAGError(f"no text files ({', '.join(TEXT_SUFFIXES)}) found under {[str(p) for p in paths]}")
    return unique


def read_text_file(path: Path) -> str:
    """The file's text; binary, non-UTF-8, unreadable or empty files are a clear error."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FusionRAGError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    if b"\x00" in data[:8192]:
        raise FusionRAGError(f"{str(path)!r} looks like a binary file; only UTF-8 text or markdown files can be ingested")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FusionRAGError(f"{str(path)!r} is not UTF-8 text (byte {exc.start}); convert it to UTF-8 first") from None
    if not text.strip():
        raise FusionRAGError(f"{str(path)!r} is empty")
    return text


def chunk_text(text: str, max_words: int = 200) -> list[str]:
    """Paragraphs packed into chunks of at most ``max_words`` words; longer paragraphs are cut at
    sentence ends (or, failing that, between words)."""
    if max_words < 8:
        raise FusionRAGError(f"max_words must be >= 8, got {max_words}")
    pieces = [p for para in re.split(r"\n\s*\n", text) for p in _split_long(" ".join(para.split()), max_words) if p]
    return ["\n\n".join(group) for group in _pack(pieces, max_words)]


def _split_long(paragraph: str, max_words: int) -> list[str]:
    if len(paragraph.split()) <= max_words:
        return [paragraph]
    pieces = []
    for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
        words = sentence.split()
        pieces.extend(" ".join(words[i : i + max_words]) for i in range(0, len(words), max_words))
    return [" ".join(group) for group in _pack(pieces, max_words)]


def _pack(pieces: list[str], max_words: int) -> list[list[str]]:
    """Consecutive pieces grouped greedily so that no group passes ``max_words`` words."""
    groups: list[list[str]] = []
    words = 0
    for piece in pieces:
        size = len(piece.split())
        if groups and words + size <= max_words:
            groups[-1].append(piece)
            words += size
        else:
            groups.append([piece])
            words = size
    return groups


def load_chunks(paths: Iterable[str | Path], max_words: int = 200) -> list[DocumentChunk]:
    chunks = []
    for path in find_files(paths):
        for index, text in enumerate(chunk_text(read_text_file(path), max_words)):
            chunks.append(DocumentChunk(text=text, source=str(path), index=index))
    return chunks
