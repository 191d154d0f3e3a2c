"""What the security suite's conftest and tests share. A module of its own name: pytest
loads every test folder's conftest as the one module `conftest`, so `from conftest import`
in a test gets whichever folder's conftest came last, depending on the command line."""

import time

# The keyed server's body limit (--max-body-bytes): small, so oversized requests are quick.
MAX_BODY = 2 << 20


def poll_until(done, seconds, what):
    """Polls `done` every 0.1 s until it holds, failing after `seconds`."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.1)
