"""The `hardware` group's code, usable from every layer above losses/: rank collectives (distributed.py),
how many processes a job asks for (processes.py), FSDP2 sharding (sharding.py), memory settings
(memory.py) and rank-0 console lines (console.py)."""
