"""The dashboard's panels."""
