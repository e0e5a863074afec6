"""An input_file's text (the Responses API: a message's content part): setflow keeps no files
and its models read text, so a file comes in the request (`file_data`) and is read as its text:
a text file (text/*, JSON, CSV, YAML, XML) as UTF-8, a PDF as the text of its pages (PDFium, as
pypdfium2 binds it).  A file that holds no text (an image, a scanned PDF) is refused, saying so."""

from __future__ import annotations

import base64
import binascii
import re
import threading
from typing import Any

#: the media types an input_file may hold: it is read as text
TEXT_FILES = re.compile(r"text/[\w.+-]+|application/(?:json|x-ndjson|jsonl|csv|x-yaml|yaml|xml)")
PDF = "application/pdf"
PDF_MAX_PAGES = 64  # a PDF's pages read, at most: a longer one is refused before any page is read
#: PDFium is not thread-safe, and the API reads requests on several threads: one PDF at a time
_PDFIUM = threading.Lock()


def file_text(part: dict[str, Any]) -> str:
    """An input_file's text: `file_data` (a data URL, `data:<type>;base64,...`, base64 alone, or
    the text itself) or `text`: of a text media type (text/*, JSON, CSV), UTF-8; or a PDF (by
    its media type, or its bytes' `%PDF-`), its pages' text.  ValueError otherwise: a file by id
    or URL (setflow keeps no files), another binary file, a PDF with no text."""
    name = f"input_file {str(part['filename'])[:128]!r}" if part.get("filename") else "the input_file"
    data = part.get("file_data", part.get("text"))
    if not isinstance(data, str):
        raise ValueError(f"{name}: send its content as file_data (base64, or a data URL); setflow keeps "
                         "no files, so file_id and file_url cannot be read")
    raw: bytes | None = None
    media = ""
    if data.startswith("data:") and "," in data:
        head, body = data[5:].split(",", 1)
        media = head.split(";")[0].strip().lower()
        if media and media != PDF and not TEXT_FILES.fullmatch(media):
            raise ValueError(f"{name} is {media}: setflow's models read text only (text, CSV, JSON, PDF)")
        raw = _b64(body) if head.endswith(";base64") else body.encode()
    else:
        raw = _b64(data) if len(data) % 4 == 0 else None
    if raw is None:
        return data  # not base64: the text itself
    if media == PDF or raw.startswith(b"%PDF-"):
        return pdf_text(raw, name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not UTF-8 text: setflow's models read text only (text, CSV, JSON, PDF)") \
            from None
    if "\x00" in text:
        raise ValueError(f"{name} is binary: setflow's models read text only (text, CSV, JSON, PDF)")
    return text


def pdf_text(raw: bytes, name: str) -> str:
    """A PDF's text: its pages' in order, a blank line between two.  ValueError where PDFium
    cannot open it (not a PDF, damaged, encrypted), where it has more than PDF_MAX_PAGES pages, or
    where its pages hold no text (a scan: images, which setflow's models cannot read)."""
    import pypdfium2 as pdfium  # only where a PDF comes: the API's other requests never load PDFium

    pages: list[str] = []
    with _PDFIUM:
        try:
            pdf = pdfium.PdfDocument(raw)
        except pdfium.PdfiumError as e:
            raise ValueError(f"{name} is no PDF setflow can read: {e}") from None
        try:
            if len(pdf) > PDF_MAX_PAGES:
                raise ValueError(f"{name} has {len(pdf)} pages: setflow reads a PDF of {PDF_MAX_PAGES} at most")
            for i in range(len(pdf)):
                page = pdf[i]
                textpage = page.get_textpage()
                pages.append(textpage.get_text_range().replace("\r\n", "\n").strip())
                textpage.close()
                page.close()
        finally:
            pdf.close()
    text = "\n\n".join(p for p in pages if p)
    if not text:
        raise ValueError(f"{name} is a PDF whose pages hold no text (a scan: images, which setflow's models "
                         "cannot read); send its text")
    return text


def _b64(s: str) -> bytes | None:
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        return None
