"""Conditions as data: proxy and client policies, engine arguments, the shipped conditions and client profiles."""
