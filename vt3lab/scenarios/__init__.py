"""What vt3 runs with the library, kept apart from it: the demo, the
perftest/fio bench against siw, and the NVMe-oF and iSER set-up steps the
tests and the bench share. Nothing in vt3lab's library imports these."""
