"""Dynamic Resource Allocation (resource.k8s.io/v1) in the core: kube-scheduler's allocator, pure.

``model`` (typed objects, integers only), ``pools`` (what a node can reach), ``selector`` (the CEL
seam), ``capacity`` (consumable capacity), ``constraints``, ``allocator`` (the search). The CEL
library sits behind ``selector.SelectorCompiler``; ``celexpr`` adapts cel-expr-python. See docs/dra.md.
"""
