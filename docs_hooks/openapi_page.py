"""mkdocs hook: the HTTP API reference page (http-api.md), rendered from calibd's own OpenAPI document
at build time, so that the site lists every route as the running service documents it."""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

PAGE = "http-api.md"


def on_files(files: Files, config: Any) -> Files:
    from calibd.config import Settings
    from calibd.main import create_app

    spec = create_app(Settings(database_url="sqlite://")).openapi()
    files.append(File.generated(config, PAGE, content=render(spec)))
    return files


def render(spec: dict[str, Any]) -> str:
    lines = [
        "# HTTP API (OpenAPI)",
        "",
        f"calibd {spec['info']['version']}: every route, rendered from the OpenAPI document the service serves at "
        "`/openapi.json` (and browses at `/docs`). Keys and their scopes: [HTTP API and keys](api.md).",
        "",
    ]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            lines += [f"## {method.upper()} {path}", "", operation.get("summary", ""), ""]
            if operation.get("description"):
                lines += [_text(operation["description"]), ""]
            # The scope each route needs is in api.md's table; the document says only whether a key is asked.
            lines += ["Needs an API key when keys are in use." if operation.get("security") else "Open: no key.", ""]
            parameters = operation.get("parameters") or []
            if parameters:
                lines += ["| parameter | in | required | description |", "|---|---|---|---|"]
                for parameter in parameters:
                    lines.append(f"| `{parameter['name']}` | {parameter['in']} | {'yes' if parameter.get('required') else 'no'} "
                                 f"| {_cell(parameter.get('description', ''))} |")
                lines.append("")
            body = operation.get("requestBody")
            if body:
                lines += ["Body: " + ", ".join(f"`{kind}`" for kind in body.get("content", {})) + ".", ""]
            responses = operation.get("responses") or {}
            lines += ["Answers: " + ", ".join(f"{code} ({_cell(r.get('description', ''))})" for code, r in responses.items()) + ".", ""]
    return "\n".join(lines) + "\n"


def _text(value: str) -> str:
    return value.replace("<", "&lt;")


def _cell(value: str) -> str:
    return _text(value).replace("|", "\\|").replace("\n", " ")
