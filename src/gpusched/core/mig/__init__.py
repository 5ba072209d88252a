"""MIG in the core: GPU geometry and instances (``geometry``), the per-model profile table (``profiles``),
the MIG fragmentation measure (``measure``) and placement policies over a fleet (``placement``).
Pure: integers and arrays only, no I/O."""
