"""Split-framework doubles for the tests of sluice.source: an enumerator of fixed ends, a reader of nothing."""

from sluice.source import Split, SplitEnumerator, SplitReader


class ListEnumerator(SplitEnumerator):
    def __init__(self, ends):
        self.ends = ends  # split id -> current end position

    def discover(self):
        return [Split(name) for name in self.ends]

    def start_position(self, split):
        return 0

    def end_position(self, split):
        return self.ends[split.split_id]


class NoReader(SplitReader):
    def read(self, split, start, end):
        yield from ()
