package sched

// slot is a queued request, its enqueue sequence number and its record.
type slot struct {
	req Request
	seq uint64
	res *reservation
}

// ring is a FIFO in a power-of-two circular buffer. It starts small and
// doubles when full, so mostly idle tenants cost little and a busy one stops
// allocating once its buffer fits its queue bound.
type ring[T any] struct {
	buf  []T
	head int
	n    int
}

func (q *ring[T]) push(v T) {
	if q.n == len(q.buf) {
		q.resize(max(2*len(q.buf), 4))
	}
	q.buf[(q.head+q.n)&(len(q.buf)-1)] = v
	q.n++
}

// resize moves the elements into a buffer of size (a power of two, at least
// q.n).
func (q *ring[T]) resize(size int) {
	buf := make([]T, size)
	for i := 0; i < q.n; i++ {
		buf[i] = q.buf[(q.head+i)&(len(q.buf)-1)]
	}
	q.buf, q.head = buf, 0
}

// shrink halves the buffer when it is at most a quarter full, so a ring that
// once held a burst gives the memory back; each halving copies at most a
// quarter of the elements it frees room for, so the cost is amortised O(1).
func (q *ring[T]) shrink() {
	if len(q.buf) > 64 && q.n <= len(q.buf)/4 {
		q.resize(len(q.buf) / 2)
	}
}

// front returns the oldest element; the ring must not be empty.
func (q *ring[T]) front() *T { return &q.buf[q.head] }

// pop removes and returns the oldest element; the ring must not be empty.
func (q *ring[T]) pop() T {
	v := q.buf[q.head]
	var zero T
	q.buf[q.head] = zero // drop references for the GC
	q.head = (q.head + 1) & (len(q.buf) - 1)
	q.n--
	return v
}

// heapEntry keys a backlogged tenant by the virtual finish time of its head
// request; seq (the head's enqueue number) breaks ties so equal finish times
// are served first-come first-served and the order is deterministic.
type heapEntry struct {
	key int64
	seq uint64
	t   *tenant
}

// tenantHeap is a binary min-heap of backlogged tenants. Keys sit in the
// slice, not behind the tenant pointer, so sifting touches one array; each
// tenant tracks its index so a settle can fix its key in O(log n).
type tenantHeap []heapEntry

func (h tenantHeap) less(i, j int) bool {
	return h[i].key < h[j].key || (h[i].key == h[j].key && h[i].seq < h[j].seq)
}

func (h tenantHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].t.heapIndex = i
	h[j].t.heapIndex = j
}

func (h *tenantHeap) push(e heapEntry) {
	*h = append(*h, e)
	i := len(*h) - 1
	e.t.heapIndex = i
	h.up(i)
}

// replaceTop puts e at the root (where the same tenant was) and sifts it.
func (h tenantHeap) replaceTop(e heapEntry) {
	h[0] = e
	e.t.heapIndex = 0
	h.down(0)
}

func (h *tenantHeap) popTop() { h.remove(0) }

func (h *tenantHeap) remove(i int) {
	old := *h
	last := len(old) - 1
	old[i].t.heapIndex = -1
	if i != last {
		old[i] = old[last]
		old[i].t.heapIndex = i
	}
	old[last] = heapEntry{}
	*h = old[:last]
	if cap(old) > 64 && last < cap(old)/4 {
		// A burst of backlogged tenants is over: give its array back.
		*h = append(make(tenantHeap, 0, 2*last), old[:last]...)
	}
	if i != last {
		h.fix(i)
	}
}

func (h tenantHeap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h tenantHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

// down sifts i toward the leaves and reports whether it moved.
func (h tenantHeap) down(i int) bool {
	start := i
	n := len(h)
	for {
		child := 2*i + 1
		if child >= n {
			break
		}
		if right := child + 1; right < n && h.less(right, child) {
			child = right
		}
		if !h.less(child, i) {
			break
		}
		h.swap(i, child)
		i = child
	}
	return i > start
}
