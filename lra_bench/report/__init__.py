"""The report: reads result records and the published references; writes tables, figures, index.md."""
