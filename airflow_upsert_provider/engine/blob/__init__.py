"""One interface over the table's files (local disk, object storage): put, get, list, delete.

May import: engine.errors."""
