"""The closed loop: traffic -> ingest -> rewards -> learner -> gate -> hot swap, and again."""
