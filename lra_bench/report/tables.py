"""A small display table rendered as Markdown and LaTeX (pandas' renderers need optional packages).

The numbers behind each table are written as CSV by the report, straight from its pandas frames.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Table:
  """Rows of display strings; ``bold`` holds (row, column) indices of cells to emphasize.

  ``footnotes`` explain the table's marks (they go with it into the LaTeX too); ``notes`` are the
  Markdown-only list of per-cell remarks (missing cells and their fixes).
  """

  columns: list[str]
  rows: list[list[str]]
  bold: set[tuple[int, int]] = dataclasses.field(default_factory=set)
  caption: str = ""
  notes: list[str] = dataclasses.field(default_factory=list)
  left: int = 1  # leading text columns (left-aligned); the rest are numbers (right-aligned)
  footnotes: list[str] = dataclasses.field(default_factory=list)

  def _cell(self, r: int, c: int, text: str, fmt: str) -> str:
    if (r, c) not in self.bold or not text:
      return text
    return f"**{text}**" if fmt == "md" else f"\\textbf{{{text}}}"

  def to_markdown(self) -> str:
    esc = lambda s: str(s).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, self.columns)) + " |",
             "|" + "|".join("---" if i < self.left else "---:" for i in range(len(self.columns))) + "|"]
    for r, row in enumerate(self.rows):
      lines.append("| " + " | ".join(self._cell(r, c, esc(v), "md") for c, v in enumerate(row)) + " |")
    out = "\n".join(lines)
    if self.caption:
      out = f"{self.caption}\n\n{out}"
    if self.footnotes:
      out += "\n\n" + "\n".join(f"- {n}" for n in self.footnotes)
    if self.notes:
      out += "\n\n" + "\n".join(f"- {n}" for n in self.notes)
    return out

  def to_latex(self) -> str:
    def esc(s: str) -> str:
      for a, b in (("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("_", "\\_"), ("#", "\\#"),
                   ("±", "$\\pm$"), ("≈", "$\\approx$"), ("×", "$\\times$"), ("−", "$-$"), ("Δ", "$\\Delta$"),
                   ("†", "$\\dagger$")):
        s = s.replace(a, b)
      return s

    lines = ["\\begin{table}[t]", "\\centering", "\\small",
             "\\begin{tabular}{" + "l" * self.left + "r" * (len(self.columns) - self.left) + "}", "\\toprule",
             " & ".join(esc(c) for c in self.columns) + " \\\\", "\\midrule"]
    for r, row in enumerate(self.rows):
      lines.append(" & ".join(self._cell(r, c, esc(str(v)), "tex") for c, v in enumerate(row)) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    if self.footnotes:
      lines.append("\\par\\smallskip{\\footnotesize " + " \\\\\n".join(esc(f) for f in self.footnotes) + "}")
    if self.caption:
      lines.append(f"\\caption{{{esc(self.caption)}}}")
    lines.append("\\end{table}")
    return "\n".join(lines) + "\n"
