"""What a run leaves, defined once (minillm/schema.py): a real run's summary.json holds exactly the schema's fields,
with their types; docs/definitions.md prints the schema's table; the report's columns read schema fields; and the
fields several modules share are spelt once, in the schema."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from helpers import RESUMABLE, run_fast

from minillm import schema
from minillm.analysis.report import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
JSON_TYPES = {"string": str, "number": (int, float), "integer": int, "boolean": bool, "list": list, "object": dict,
              "null": type(None)}


def _type_ok(value, declared: str) -> bool:
    allowed = tuple(t for name in declared.split("|") for t in
                    (JSON_TYPES[name] if isinstance(JSON_TYPES[name], tuple) else (JSON_TYPES[name],)))
    if isinstance(value, bool) and bool not in allowed:  # a JSON boolean is no number
        return False
    return isinstance(value, allowed)


def test_a_real_runs_summary_holds_exactly_the_schemas_fields_with_their_types(tmp_path, corpus):
    run = run_fast(tmp_path, corpus, *RESUMABLE, "test=true")
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary) - set(schema.FIELDS) == set(), "summary.json fields the schema does not define"
    assert set(schema.FIELDS) - set(summary) <= set(schema.OPTIONAL), "schema fields a plain run did not write"
    wrong = {k: (v, schema.FIELDS[k].type) for k, v in summary.items() if not _type_ok(v, schema.FIELDS[k].type)}
    assert not wrong


def test_docs_definitions_print_the_schema_table():
    text = (ROOT / "docs" / "definitions.md").read_text()
    start, end = text.index("<!-- schema:start -->\n"), text.index("<!-- schema:end -->")
    assert text[start + len("<!-- schema:start -->\n"):end] == schema.markdown()


def test_the_reports_columns_read_schema_fields():
    assert {c.field for c in COLUMNS} <= set(schema.FIELDS)


def test_shared_fields_are_spelt_once():
    """No module of minillm/ but the schema types a shared field's name as a string: they use schema's names."""
    typed = []
    for path in sorted((ROOT / "minillm").rglob("*.py")):
        if path.name == "schema.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in schema.SPELT_ONCE:
                typed.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not typed
