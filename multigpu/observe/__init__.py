"""What a run tells about itself while it trains: throughput and MFU, the run plan, stragglers, progress, the model's
summary."""
