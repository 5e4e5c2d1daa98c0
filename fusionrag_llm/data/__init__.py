"""Small data bundled with the package (the demo corpus)."""
