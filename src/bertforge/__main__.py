"""`python -m bertforge` is the `bertforge` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
