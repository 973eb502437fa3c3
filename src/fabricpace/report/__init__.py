"""Reports: the self-contained HTML report, its figures, Perfetto export and terminal tables."""
