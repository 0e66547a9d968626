"""The ``invoices`` app: gap-free invoice numbers issued under one FIFO lock."""
