"""Watches: the hub that feeds them from the apply stage in log order."""
