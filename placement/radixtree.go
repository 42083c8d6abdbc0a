package placement

import (
	"container/heap"
	"slices"
)

// charTree is the approximate radix tree over characters that SGLang's
// router keeps (now lightseekorg/smg crates/kv_index/src/string_tree.rs
// @73da68c Tree), which vllm-project/router forked and Ray Serve's
// PrefixCacheAffinityRouter ported (prefix_tree.py): one tree per model,
// every node an edge of text with the tenants (replicas) that inserted
// through it and when; a tenant's character count is the text of the
// nodes it is on. Written here from their behaviour, over vtext:
//
//   - match walks from the root while a child starts with the next
//     character; a child whose text is matched in full is entered, a
//     partial match counts its shared characters and stops. The match's
//     tenant is the node's cached last tenant while it is still a tenant
//     there, else the first tenant listed (string_tree.rs
//     resolve_tenant_readonly; the first of a DashMap's iteration there,
//     the first attached here). One match in 8 (by the global epoch
//     counter) refreshes that tenant's time on the node.
//   - insert attaches the tenant with time 0 to every node it passes
//     (intermediate nodes are not refreshed, and a split node inherits
//     the old node's tenants and times), splits a node where the text
//     diverges inside it, and gives the final node the current epoch.
//   - evict (evict_tenant_by_size): per tenant over maxChars, pop that
//     tenant's leaves (nodes it is on that no child of it holds) oldest
//     first; a node left with no tenant and no child is removed, and a
//     parent that becomes the tenant's leaf joins the heap.
type charTree struct {
	nodes []ctNode
	free  []int32
	epoch uint64
	chars []int // per tenant (replica index): characters held
}

type ctNode struct {
	text       vtext
	first      byte
	parent     int32
	children   []int32
	tenants    []ctTenant
	lastTenant int32 // -1: none cached
	live       bool
}

type ctTenant struct {
	rep int32
	at  uint64
}

const ctRoot = 0

func newCharTree() *charTree {
	return &charTree{nodes: []ctNode{{parent: -1, lastTenant: -1, live: true}}}
}

func (t *charTree) nextEpoch() uint64 {
	t.epoch++
	return t.epoch
}

func (n *ctNode) tenantAt(rep int32) int {
	for i, x := range n.tenants {
		if x.rep == rep {
			return i
		}
	}
	return -1
}

func (t *charTree) child(n int32, b byte) int32 {
	for _, c := range t.nodes[n].children {
		if t.nodes[c].first == b {
			return c
		}
	}
	return -1
}

func (t *charTree) grow(rep int32) {
	for int(rep) >= len(t.chars) {
		t.chars = append(t.chars, 0)
	}
}

func (t *charTree) newNode(text vtext, parent int32) int32 {
	nd := ctNode{text: text, first: text.first(), parent: parent, lastTenant: -1, live: true}
	if k := len(t.free); k > 0 {
		i := t.free[k-1]
		t.free = t.free[:k-1]
		nd.children = t.nodes[i].children[:0]
		nd.tenants = t.nodes[i].tenants[:0]
		t.nodes[i] = nd
		return i
	}
	t.nodes = append(t.nodes, nd)
	return int32(len(t.nodes) - 1)
}

// treeMatch is a match's result: the characters matched, the prompt's
// length, and the tenant of the node the match stopped on (-1: none).
type treeMatch struct {
	matched, total int
	tenant         int32
	node           int32
}

// match walks text down the tree (see charTree). It does the match's own
// side effects (the cached tenant, the 1-in-8 refresh) and nothing else.
func (t *charTree) match(text vtext) treeMatch {
	c := cursor{t: text}
	m := treeMatch{total: text.size(), tenant: -1, node: ctRoot}
	cur := int32(ctRoot)
	for !c.done() {
		ch := t.child(cur, c.first())
		if ch < 0 {
			break
		}
		nt := t.nodes[ch].text
		s := c.shared(nt)
		m.matched += s
		m.node = ch
		if s < nt.size() {
			break
		}
		c.advance(s)
		cur = ch
	}
	nd := &t.nodes[m.node]
	if nd.lastTenant >= 0 && nd.tenantAt(nd.lastTenant) >= 0 {
		m.tenant = nd.lastTenant
	} else if len(nd.tenants) > 0 {
		m.tenant = nd.tenants[0].rep
		nd.lastTenant = m.tenant
	}
	if e := t.nextEpoch(); e&7 == 0 && m.tenant >= 0 {
		nd.tenants[nd.tenantAt(m.tenant)].at = e
	}
	return m
}

// attach puts rep on node n with time at (0: an intermediate node, which
// keeps the time it has), counting its characters when it is new there.
func (t *charTree) attach(n int32, rep int32, at uint64) {
	nd := &t.nodes[n]
	if i := nd.tenantAt(rep); i >= 0 {
		if at != 0 {
			nd.tenants[i].at = at
		}
		return
	}
	nd.tenants = append(nd.tenants, ctTenant{rep: rep, at: at})
	if n != ctRoot {
		t.grow(rep)
		t.chars[rep] += nd.text.size()
	}
}

// insert adds text for tenant rep (see charTree).
func (t *charTree) insert(text vtext, rep int32) {
	t.grow(rep)
	t.attach(ctRoot, rep, 0)
	c := cursor{t: text}
	cur := int32(ctRoot)
	for !c.done() {
		ch := t.child(cur, c.first())
		if ch < 0 {
			rest := c.rest()
			n := t.newNode(rest, cur)
			t.nodes[cur].children = append(t.nodes[cur].children, n)
			t.nodes[n].lastTenant = rep
			t.nodes[n].tenants = append(t.nodes[n].tenants, ctTenant{rep: rep, at: t.nextEpoch()})
			t.chars[rep] += rest.size()
			return
		}
		nt := t.nodes[ch].text
		s := c.shared(nt)
		if s < nt.size() {
			ch = t.splitNode(cur, ch, s)
		}
		t.attach(ch, rep, 0)
		c.advance(s)
		cur = ch
	}
	t.attach(cur, rep, t.nextEpoch())
}

// splitNode splits child ch of parent at k characters and returns the
// new upper node, which inherits ch's tenants, their times and its cached
// tenant.
func (t *charTree) splitNode(parent, ch int32, k int) int32 {
	head, tail := t.nodes[ch].text.split(k)
	up := t.newNode(head, parent)
	t.nodes[up].tenants = append(t.nodes[up].tenants, t.nodes[ch].tenants...)
	t.nodes[up].lastTenant = t.nodes[ch].lastTenant
	t.nodes[up].children = append(t.nodes[up].children, ch)
	t.nodes[ch].text, t.nodes[ch].first, t.nodes[ch].parent = tail, tail.first(), up
	kids := t.nodes[parent].children
	kids[slices.Index(kids, ch)] = up
	return up
}

// leafOf reports whether node n holds rep and no child of it does.
func (t *charTree) leafOf(n, rep int32) bool {
	if t.nodes[n].tenantAt(rep) < 0 {
		return false
	}
	for _, c := range t.nodes[n].children {
		if t.nodes[c].tenantAt(rep) >= 0 {
			return false
		}
	}
	return true
}

// evict trims every tenant to at most maxChars characters (see charTree).
func (t *charTree) evict(maxChars int) {
	var h evictHeap
	for n := range t.nodes {
		if n == ctRoot || !t.nodes[n].live {
			continue
		}
		for _, x := range t.nodes[n].tenants {
			if t.leafOf(int32(n), x.rep) {
				h = append(h, evictEntry{at: x.at, rep: x.rep, node: int32(n)})
			}
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		e := heap.Pop(&h).(evictEntry)
		if t.chars[e.rep] <= maxChars || !t.nodes[e.node].live || !t.leafOf(e.node, e.rep) {
			continue
		}
		nd := &t.nodes[e.node]
		t.chars[e.rep] -= nd.text.size()
		i := nd.tenantAt(e.rep)
		nd.tenants = slices.Delete(nd.tenants, i, i+1)
		if nd.lastTenant == e.rep {
			nd.lastTenant = -1
		}
		parent := nd.parent
		if len(nd.children) == 0 && len(nd.tenants) == 0 {
			kids := t.nodes[parent].children
			t.nodes[parent].children = slices.Delete(kids, slices.Index(kids, e.node), slices.Index(kids, e.node)+1)
			nd.live = false
			nd.text = nil
			t.free = append(t.free, e.node)
		}
		if parent != ctRoot && t.leafOf(parent, e.rep) {
			p := &t.nodes[parent]
			heap.Push(&h, evictEntry{at: p.tenants[p.tenantAt(e.rep)].at, rep: e.rep, node: parent})
		}
	}
}

// tenantSize is the characters rep holds.
func (t *charTree) tenantSize(rep int) int {
	if rep < len(t.chars) {
		return t.chars[rep]
	}
	return 0
}

type evictEntry struct {
	at   uint64
	rep  int32
	node int32
}

// evictHeap orders leaves oldest first; ties by node then tenant, so the
// order never depends on map iteration.
type evictHeap []evictEntry

func (h evictHeap) Len() int { return len(h) }
func (h evictHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	if h[i].node != h[j].node {
		return h[i].node < h[j].node
	}
	return h[i].rep < h[j].rep
}
func (h evictHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *evictHeap) Push(x any)   { *h = append(*h, x.(evictEntry)) }
func (h *evictHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
