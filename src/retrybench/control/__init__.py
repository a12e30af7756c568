"""The sans-IO proxy: the decisions of every overload control."""
