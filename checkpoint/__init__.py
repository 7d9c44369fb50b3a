"""The lease table and checkpointing: lease values, the lease-table port and its stores."""
