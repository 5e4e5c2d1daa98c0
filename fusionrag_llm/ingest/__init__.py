"""The document pipeline above the facade: files to chunks, the document index, retrieve-and-answer."""
