"""`nodedeck state check|backup|restore`: the node's state file (runs, events, stage records) and its backups."""

from __future__ import annotations

from pathlib import Path

from cli.common import json_flag
from cli.output import emit_json
from ops.errors import UserError
from ops.state import StateStore
from ops.state.backup import backups_of, check_file, restore
from ops.state.file import node_state_path


def _path(args) -> Path:
    if args.file:
        return Path(args.file)
    if not args.node:
        raise UserError("state: name a NODE or give --file PATH")
    return node_state_path(args.node)


def cmd_check(args) -> int:
    path = _path(args)
    if not path.exists():
        raise UserError(f"{path}: no state file")
    why = check_file(path)
    found = [{"path": str(b), "problem": check_file(b)} for b in backups_of(path)]
    if args.json:
        emit_json({"path": str(path), "ok": why is None, "problem": why, "backups": found})
    else:
        print(f"{path}: {'ok' if why is None else why}")
        for b in found:
            print(f"  backup {b['path']}: {b['problem'] or 'ok'}")
    return 0 if why is None else 1


def cmd_backup(args) -> int:
    path = _path(args)
    if not path.exists():
        raise UserError(f"{path}: no state file")
    store = StateStore(path)
    try:
        dest = store.backup()
    finally:
        store.close()
    if args.json:
        emit_json({"path": str(store.path), "backup": str(dest)})
    else:
        print(f"backed up {store.path} to {dest}")
    return 0


def cmd_restore(args) -> int:
    done = restore(_path(args), Path(args.source) if args.source else None, force=args.force)
    if args.json:
        emit_json(done.to_json())
    else:
        print(f"restored {done.path} from {done.source}"
              + (f"; the file it replaced is kept as {done.kept}" if done.kept else ""))
    return 0


def register(sub) -> None:
    p = sub.add_parser("state", help="check, back up or restore a node's state file")
    ssub = p.add_subparsers(dest="state_command", required=True, parser_class=type(p))
    for name, func, text in (("check", cmd_check, "is the state file sound (and its backups)"),
                             ("backup", cmd_backup, "take a backup now (one is also taken every few minutes)"),
                             ("restore", cmd_restore, "put the newest sound backup in place of a damaged file")):
        q = ssub.add_parser(name, help=text)
        q.add_argument("node", nargs="?", metavar="NODE", help="the node whose state it is")
        q.add_argument("--file", metavar="PATH", help="a state file by path instead of NODE")
        json_flag(q)
        if name == "restore":
            q.add_argument("--from", dest="source", metavar="BACKUP",
                           help="this backup file (default: the newest sound)")
            q.add_argument("--force", action="store_true", help="restore even over a sound state file")
        q.set_defaults(func=func)
