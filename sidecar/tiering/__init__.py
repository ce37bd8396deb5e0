"""The local → remote pipeline: detect rolled segments, plan, upload, publish."""
