"""runtime/api/openai/input_files.py: an input_file read as its text: a text file as UTF-8, a PDF as its
pages' text (PDFium); a PDF that does not open, that is too long or whose pages hold no text is
refused in words (the Open Responses suite's file-input test sent a one-page PDF: a 400 before)."""

from __future__ import annotations

import base64

import pytest

from runtime.api.openai import input_files
from runtime.api.openai.input_files import file_text


def pdf(*pages: str) -> bytes:
    """A PDF of one page per text (Helvetica, one line each; "" an empty page), with its xref."""
    n = len(pages)
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n))
    objs = ["<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {n} >>"]
    for i, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 72 Td ({text}) Tj ET" if text else ""
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 144] /Contents {4 + 2 * i} 0 R "
                    f"/Resources << /Font << /F1 {3 + 2 * n} 0 R >> >> >>")
        objs.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    objs.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out, offsets = b"%PDF-1.4\n", []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n{o}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_pdf_is_read_as_its_pages_text_by_media_type_or_by_its_bytes() -> None:
    doc = pdf("Title: Quarterly KPIs", "Revenue in EMEA was 812.")
    want = "Title: Quarterly KPIs\n\nRevenue in EMEA was 812."
    assert file_text({"filename": "k.pdf", "file_data": f"data:application/pdf;base64,{b64(doc)}"}) == want
    assert file_text({"filename": "k.pdf", "file_data": b64(doc)}) == want  # base64 alone: its bytes say PDF


@pytest.mark.parametrize("data, words", [
    (f"data:application/pdf;base64,{b64(b'%PDF-1.4')}", "'a.pdf' is no PDF setflow can read"),
    (f"data:application/pdf;base64,{b64(pdf(''))}", "hold no text (a scan"),
    (f"data:image/png;base64,{b64(b'png')}", "'a.pdf' is image/png: setflow's models read text only"),
])
def test_a_file_with_no_text_to_read_is_refused_in_words(data: str, words: str) -> None:
    with pytest.raises(ValueError) as e:
        file_text({"filename": "a.pdf", "file_data": data})
    assert words in str(e.value), e.value


def test_a_pdf_past_the_page_limit_is_refused_before_its_pages_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(input_files, "PDF_MAX_PAGES", 2)
    with pytest.raises(ValueError, match="has 3 pages: setflow reads a PDF of 2 at most"):
        file_text({"file_data": b64(pdf("a", "b", "c"))})


def test_a_text_file_is_read_as_utf8() -> None:
    csv = b"market,revenue\nEMEA,812\n"
    assert file_text({"file_data": f"data:text/csv;base64,{b64(csv)}"}) == csv.decode()
    assert file_text({"file_data": "plain words"}) == "plain words"  # not base64: the text itself
