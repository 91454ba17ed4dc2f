"""The canary: a challenger serves a share of live traffic until live rewards decide (issue #15)."""
