"""Items of any type: optimize, map, the Ray engine."""
