"""The search tool: BM25 over a local corpus, the retrieval setting of Search-R1.

A corpus is a JSONL file, one document per line: {"id": ..., "text": ...} with an
optional "title". `SearchIndex.from_jsonl` indexes it once with `bm25s` (sparse
matrices, milliseconds per query on tens of thousands of passages); `index.tool()`
is the tool the model calls. Results are the top passages, each cut to a snippet,
numbered, with their ids, so the model can quote where an answer came from.
A query that matches nothing says so instead of returning zero-score noise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s

from toolpolicy.jsonl import read_objects
from toolpolicy.tools.decorator import Tool, ToolError, tool

MAX_QUERY_CHARS = 500
MAX_RESULTS = 10


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    title: str = ""


@dataclass(frozen=True)
class Hit:
    document: Document
    score: float


class CorpusError(ValueError):
    """A corpus file that cannot be indexed; the message names the file and the line."""


class SearchIndex:
    """A BM25 index over documents, built once and then only read (safe to share)."""

    def __init__(self, documents: Iterable[Document], stopwords: str | None = "en") -> None:
        self.documents = list(documents)
        if not self.documents:
            raise CorpusError("a search index needs at least one document")
        self.stopwords = stopwords
        corpus = [f"{doc.title}\n{doc.text}" if doc.title else doc.text for doc in self.documents]
        self._bm25 = bm25s.BM25()
        self._bm25.index(self._tokens(corpus), show_progress=False)

    @classmethod
    def from_jsonl(cls, path: str | Path, stopwords: str | None = "en") -> SearchIndex:
        return cls(read_corpus(path), stopwords)

    def _tokens(self, texts: list[str]) -> list[list[str]]:
        return bm25s.tokenize(texts, stopwords=self.stopwords, return_ids=False, show_progress=False)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """The best `k` documents with a positive score, best first."""
        k = max(0, min(k, len(self.documents)))
        if k == 0 or not query.strip():
            return []
        ids, scores = self._bm25.retrieve(self._tokens([query]), k=k, show_progress=False)
        return [Hit(self.documents[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]

    def tool(self, name: str = "search", snippet_chars: int = 400) -> Tool:
        """The tool the model calls: `search(query, k=3)`."""
        index = self

        def search(query: str, k: int = 3) -> str:
            """Search the document collection and return the most relevant passages.

            Args:
                query: Words to look for, e.g. "capital of Australia".
                k: How many passages to return (1 to 10).
            """
            if len(query) > MAX_QUERY_CHARS:
                raise ToolError(f"query is {len(query)} characters; keep it under {MAX_QUERY_CHARS}")
            if not 1 <= k <= MAX_RESULTS:
                raise ToolError(f"k must be between 1 and {MAX_RESULTS}, not {k}")
            return format_hits(index.search(query, k), snippet_chars)

        return tool(name=name)(search)


def format_hits(hits: list[Hit], snippet_chars: int) -> str:
    """Numbered passages as the model reads them, or a line saying nothing matched."""
    if not hits:
        return "No document matches the query. Try other words."
    blocks = []
    for rank, hit in enumerate(hits, 1):
        doc = hit.document
        text = doc.text if len(doc.text) <= snippet_chars else doc.text[:snippet_chars].rstrip() + " …"
        heading = f"[{rank}] {doc.id}" + (f" — {doc.title}" if doc.title else "")
        blocks.append(f"{heading}\n{text}")
    return "\n\n".join(blocks)


def read_corpus(path: str | Path) -> list[Document]:
    """Documents from a JSONL file; any bad line is a CorpusError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such corpus file")
    documents: list[Document] = []
    seen: set[str] = set()
    for where, row in read_objects(path, CorpusError):
        documents.append(_document(row, where))
        if documents[-1].id in seen:
            raise CorpusError(f"{where}: duplicate document id {documents[-1].id!r}")
        seen.add(documents[-1].id)
    if not documents:
        raise CorpusError(f"{path}: the corpus is empty")
    return documents


def _document(row: dict[str, Any], where: str) -> Document:
    for field in ("id", "text"):
        if not isinstance(row.get(field), (str, int)) or row.get(field) == "":
            raise CorpusError(f"{where}: field {field!r} is missing or not a non-empty string")
    title = row.get("title", "")
    if not isinstance(title, str):
        raise CorpusError(f"{where}: field 'title' must be a string")
    return Document(str(row["id"]), str(row["text"]), title)
