"""Validity masks for pointer decoding: which slot each hypothesis may emit next.

Every constraint keeps its state as tensors with one row per hypothesis (R rows, batch * beam), so a
step is a few tensor operations for the whole beam, on any device.  Slot 0 is the end position,
slot i the i-th point (1-based).  Rows have ``n`` points each; ``max_steps`` (R,) bounds the output
length including the end.  The masks never lead into a dead end: every allowed prefix can be
completed to a valid output (tested against an enumeration of the valid outputs for small n).

Valid outputs (what the masks allow, exactly):

* ``convex_hull``: k >= 3 distinct points, the first one the lowest index (the canonical start), then
  the first point again (closing the polygon), then the end.  Orientation is left to the model.
* ``tsp``: city 1, the other cities once each with the second city lower than the last one (the
  canonical direction), city 1 again, then the end.
* ``delaunay``: 1 .. max(1, 2n - 5) triangles (a triangulation of n points has 2n - 2 - h <= 2n - 5
  of them), each an increasing triple, the triples strictly increasing in lexicographic order (the
  canonical order, so no triangle twice); the end only between triangles.
* unconstrained (``--pointer-unconstrained``): any real slot; the end forced at the problem's longest
  valid length.
"""
import torch


def max_output_steps(problem, n):
    """(R,) point counts -> (R,) longest valid output, end included."""
    if problem == "delaunay":
        return 3 * (2 * n - 5).clamp(min=1) + 1
    return n + 2  # hull: at most n points + closing + end; tsp: n cities + closing + end


class SlotConstraint:
    """Base: state tensors listed in ``fields`` (dim 0 = rows), reordered together."""

    fields = ()

    def __init__(self, problem, n, num_slots):
        self.problem = problem
        self.n = n
        self.idx = torch.arange(num_slots, device=n.device).unsqueeze(0)  # (1, S)
        self.point = (self.idx >= 1) & (self.idx <= n.unsqueeze(1))  # (R, S)
        self.end = (self.idx == 0).expand_as(self.point)
        self.max_steps = max_output_steps(problem, n)
        self.step = 0

    def reorder(self, order):
        for name in self.fields + ("n", "point", "end", "max_steps"):
            setattr(self, name, getattr(self, name).index_select(0, order))

    def allowed(self):
        raise NotImplementedError

    def update(self, slot, active):
        """Rows with ``active`` True emitted ``slot`` (R,)."""
        raise NotImplementedError

    def advance(self, slot, active):
        self.update(slot, active)
        self.step += 1

    def _visit(self, slot, rows):
        """Mark ``slot`` visited in the rows where ``rows`` is True."""
        hit = (self.idx == slot.unsqueeze(1)) & rows.unsqueeze(1)
        self.visited = self.visited | hit


class HullConstraint(SlotConstraint):
    fields = ("visited", "first", "count", "closed")

    def __init__(self, n, num_slots):
        super().__init__("convex_hull", n, num_slots)
        R = n.numel()
        self.visited = torch.zeros(R, num_slots, dtype=torch.bool, device=n.device)
        self.first = torch.zeros(R, dtype=torch.long, device=n.device)
        self.count = torch.zeros(R, dtype=torch.long, device=n.device)
        self.closed = torch.zeros(R, dtype=torch.bool, device=n.device)

    def allowed(self):
        start = self.point & (self.idx <= (self.n - 2).unsqueeze(1))  # two higher points must remain
        body = self.point & ~self.visited & (self.idx > self.first.unsqueeze(1))
        close = (self.idx == self.first.unsqueeze(1)) & (self.count >= 3).unsqueeze(1)
        out = torch.where((self.count == 0).unsqueeze(1), start, body | close)
        return torch.where(self.closed.unsqueeze(1), self.end, out)

    def update(self, slot, active):
        starting = active & (self.count == 0)
        self.first = torch.where(starting, slot, self.first)
        closing = active & ~starting & ~self.closed & (slot == self.first)
        self.closed = self.closed | closing
        visit = active & ~closing & (slot > 0)
        self._visit(slot, visit)
        self.count = self.count + visit.long()


class TSPConstraint(SlotConstraint):
    fields = ("visited", "count", "second", "closed")

    def __init__(self, n, num_slots):
        super().__init__("tsp", n, num_slots)
        R = n.numel()
        self.visited = torch.zeros(R, num_slots, dtype=torch.bool, device=n.device)
        self.count = torch.zeros(R, dtype=torch.long, device=n.device)
        self.second = torch.zeros(R, dtype=torch.long, device=n.device)
        self.closed = torch.zeros(R, dtype=torch.bool, device=n.device)

    def allowed(self):
        n, count = self.n.unsqueeze(1), self.count.unsqueeze(1)
        city1 = self.idx == 1
        free = self.point & ~self.visited
        # canonical direction (n >= 3): the last city must be higher than the second one
        higher = free & (self.idx > self.second.unsqueeze(1))
        keep_last = (count >= 2) & (count <= n - 2) & (higher.sum(1, keepdim=True) == 1)
        pick_second = (count == 1) & (n >= 3)
        body = free & ~(keep_last & higher) & ~(pick_second & (self.idx == n))
        out = torch.where(count == 0, city1, torch.where(count < n, body, city1))
        return torch.where(self.closed.unsqueeze(1), self.end, out)

    def update(self, slot, active):
        self.second = torch.where(active & (self.count == 1), slot, self.second)
        closing = active & ~self.closed & (self.count == self.n)
        self.closed = self.closed | closing
        visit = active & ~closing & (slot > 0)
        self._visit(slot, visit)
        self.count = self.count + visit.long()


class DelaunayConstraint(SlotConstraint):
    fields = ("prev", "cur", "pos", "ntri", "max_tri")

    def __init__(self, n, num_slots):
        super().__init__("delaunay", n, num_slots)
        R = n.numel()
        z = torch.zeros(R, dtype=torch.long, device=n.device)
        self.prev = torch.zeros(R, 3, dtype=torch.long, device=n.device)  # last triangle (0 = none)
        self.cur = torch.zeros(R, 2, dtype=torch.long, device=n.device)  # the triangle being emitted
        self.pos = z.clone()  # 0, 1, 2: position inside the triangle
        self.ntri = z.clone()
        self.max_tri = (2 * n - 5).clamp(min=1)

    def allowed(self):
        i, n = self.idx, self.n.unsqueeze(1)
        pa, pb, pc = (self.prev[:, k:k + 1] for k in range(3))
        a, b = self.cur[:, 0:1], self.cur[:, 1:2]
        room = (self.ntri < self.max_tri).unsqueeze(1)
        first = self.point & room & (i <= n - 2) & ((i > pa) | ((i == pa) & (pb < n - 1)))
        first = first | (self.end & (self.ntri >= 1).unsqueeze(1))
        second = self.point & (i > a) & (i <= n - 1) & ((a != pa) | (i > pb) | ((i == pb) & (pc < n)))
        third = self.point & (i > b) & ((a != pa) | (b != pb) | (i > pc))
        pos = self.pos.unsqueeze(1)
        return torch.where(pos == 0, first, torch.where(pos == 1, second, third))

    def update(self, slot, active):
        p0 = active & (self.pos == 0) & (slot > 0)
        p1 = active & (self.pos == 1)
        p2 = active & (self.pos == 2)
        self.cur = torch.stack([torch.where(p0, slot, self.cur[:, 0]), torch.where(p1, slot, self.cur[:, 1])], 1)
        done = torch.stack([self.cur[:, 0], self.cur[:, 1], slot], 1)
        self.prev = torch.where(p2.unsqueeze(1), done, self.prev)
        self.ntri = self.ntri + p2.long()
        self.pos = torch.where(p0, 1, torch.where(p1, 2, torch.where(p2, 0, self.pos)))


class UnconstrainedSlots(SlotConstraint):
    """Only padding is masked; the end is forced at the longest valid length."""

    def allowed(self):
        last = (self.max_steps - 1 <= self.step).unsqueeze(1)
        return torch.where(last, self.end, self.point | self.end)

    def update(self, slot, active):
        pass


CONSTRAINTS = {"convex_hull": HullConstraint, "tsp": TSPConstraint, "delaunay": DelaunayConstraint}


def build_constraint(problem, n, num_slots, constrained=True):
    if problem not in CONSTRAINTS:
        raise ValueError(f"unknown problem {problem!r}")
    if not constrained:
        return UnconstrainedSlots(problem, n, num_slots)
    return CONSTRAINTS[problem](n, num_slots)
