"""Reports: reliability diagrams (PNG, SVG) and the self-contained HTML report page."""

from .diagram import render_diagram
from .page import render_page

__all__ = ["render_diagram", "render_page"]
