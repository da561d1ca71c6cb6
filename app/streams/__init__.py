"""Labels from Redis Streams (``calibd consume``): see consumer.py."""
