"""The node's state store stays in parts by what it stores (issue 42 item 9): ops/state is a package whose
modules each hold one concern (the file, its schema, backups, one table each) and none grows past what a
reader takes in at once."""

from pathlib import Path

import ops.state

MODULE_LINES = 250


def test_the_state_store_is_a_package_of_small_modules():
    package = Path(ops.state.__file__)
    assert package.name == "__init__.py"
    sizes = {p.name: len(p.read_text().splitlines()) for p in package.parent.glob("*.py")}
    assert {"runs.py", "stages.py", "events.py", "audit.py", "kv.py"} <= set(sizes)
    assert {name: n for name, n in sizes.items() if n > MODULE_LINES} == {}
