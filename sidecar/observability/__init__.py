"""Logs, metrics and health: how the sidecar is watched. Imports nothing from the domain layers."""
