"""The documentation site's build-time code (the pages are the Markdown files here)."""
