"""The 2002 PathMaster QoS testbed in Linux network namespaces (Mininet style).

Modules: `netns` (namespaces, commands inside them, cleanup), `node` (Host, Router),
`link` (veth Link, bridge Lan).
"""
