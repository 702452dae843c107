"""The unittest runner of scripts/gpu/peer_suites.py, for suites written with unittest (Numba-CUDA's):

    python3 peer_unittest.py MODULE [-k PATTERN]... [--skip NAME]...

loads MODULE's tests, leaves out those whose id contains a --skip NAME, runs the rest in one process and
writes the same log as peer_plugin.py (to CUDACORE_PEER_LOG): ``start <id>`` as each test starts and
``<outcome> <id>`` as it ends, flushed, so a crash names its test. Exit status 0 when all passed, else 1.
"""

from __future__ import annotations

import os
import sys
import unittest
from typing import Any


class _Logged(unittest.TextTestResult):
    def __init__(self, log: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._log = log
        self._subfailed: set[str] = set()

    def _write(self, kind: str, test: unittest.TestCase) -> None:
        self._log.write(f"{kind} {test.id()}\n")
        self._log.flush()
        os.fsync(self._log.fileno())

    def startTest(self, test: unittest.TestCase) -> None:
        self._write("start", test)
        super().startTest(test)

    def addSuccess(self, test: unittest.TestCase) -> None:
        self._write("passed", test)
        super().addSuccess(test)

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        self._write("failed", test)
        super().addFailure(test, err)

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        self._write("error", test)
        super().addError(test, err)

    def addSubTest(self, test: unittest.TestCase, subtest: Any, err: Any) -> None:
        # A failing subtest fails its test: log it once, under the test's own id (addSuccess is then never
        # called for it).
        if err is not None and test.id() not in self._subfailed:
            self._subfailed.add(test.id())
            self._write("failed" if issubclass(err[0], test.failureException) else "error", test)
        super().addSubTest(test, subtest, err)

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        self._write("skipped", test)
        super().addSkip(test, reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        self._write("xfailed", test)
        super().addExpectedFailure(test, err)

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        self._write("xpassed", test)
        super().addUnexpectedSuccess(test)


def _flatten(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    out: list[unittest.TestCase] = []
    for t in suite:
        out.extend(_flatten(t) if isinstance(t, unittest.TestSuite) else [t])
    return out


def main() -> int:
    args = sys.argv[1:]
    module, skips = args[0], [args[i + 1] for i, a in enumerate(args) if a == "--skip"]
    tests = [t for t in _flatten(unittest.defaultTestLoader.loadTestsFromName(module)) if not any(s in t.id() for s in skips)]
    with open(os.environ["CUDACORE_PEER_LOG"], "a", encoding="utf-8") as log:
        runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=1, resultclass=lambda *a, **k: _Logged(log, *a, **k))
        result = runner.run(unittest.TestSuite(tests))
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
