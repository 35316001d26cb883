"""Measuring an unchanged script: the agent in its processes, the runner that starts it once
per mode, the time-out that stops it whole, the verification under the recommendation."""
