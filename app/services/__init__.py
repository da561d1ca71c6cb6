"""Services: one module per domain, between the routes and storage.

A route parses a request, calls one service function and shapes the answer.
A service validates through the pure core, reads and writes through storage,
and updates the monitors.
"""
