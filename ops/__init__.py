"""nodedeck operations: everything that touches a node. No UI imports here."""
