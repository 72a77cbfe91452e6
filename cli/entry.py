"""The ``hetrun`` console script: the one place a ``HetrunError`` becomes a message on
stderr and an exit code (no tracebacks for user errors).

Typer is imported only when needed: the plain forms of ``hetrun status`` (RUN...,
--runs-dir, -n, --json: cli/status_show.py ``fast_args``) run without it, because
Typer's start-up (it imports pydantic for parameter coercion and builds every
command) would be most of a status that should answer in squeue's time.
"""

from __future__ import annotations

import os
import sys

from hetrun.errors import HetrunError


def print_error(exc: HetrunError) -> None:
    # Plain stderr write: rich is not needed for one line and costs start-up time.
    sys.stderr.write(f"hetrun: error: {exc}\n")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["status"]:
            from hetrun.cli.status_show import fast_args, show_status

            parsed = fast_args(args[1:])
            if parsed is not None:
                show_status(**parsed)
                return
        from hetrun.cli.app import app

        app(args=argv, prog_name="hetrun", standalone_mode=True)
    except HetrunError as exc:
        print_error(exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("hetrun: interrupted\n")
        sys.exit(130)
    except BrokenPipeError:
        # `hetrun plan ... | head` closes the pipe early; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    main()
