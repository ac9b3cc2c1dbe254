"""The contract tables, one module per wing of the twins (plus ``base``: the request, the
radix key and node). :data:`FAMILIES` lists them all; the coverage test walks every public class
of both twins and finds each one's family here."""
