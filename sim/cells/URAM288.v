// A behavioural UltraRAM (URAM288) for simulating Yosys netlists: 4096 words of 72 bits,
// two ports on one clock, port A's operation before port B's in a cycle (a read on A
// returns the word before B's write), read data registered once (OREG "FALSE", the only
// form Yosys's urams_map.v makes), byte writes with parity interleaved (BWE[k] writes
// bits 8k..8k+7 and 64+k) or independent (BWE[8] the parity byte). No cascade, ECC or sleep.
module URAM288 #(
  parameter BWE_MODE_A = "PARITY_INTERLEAVED", parameter BWE_MODE_B = "PARITY_INTERLEAVED",
  parameter EN_AUTO_SLEEP_MODE = "FALSE", parameter IREG_PRE_A = "FALSE",
  parameter IREG_PRE_B = "FALSE", parameter [0:0] IS_CLK_INVERTED = 1'b0,
  parameter OREG_A = "FALSE", parameter OREG_B = "FALSE",
  parameter RST_MODE_A = "SYNC", parameter RST_MODE_B = "SYNC"
) (
  input [22:0] ADDR_A, input [22:0] ADDR_B, input [8:0] BWE_A, input [8:0] BWE_B,
  input CLK, input [71:0] DIN_A, input [71:0] DIN_B,
  output reg [71:0] DOUT_A, output reg [71:0] DOUT_B,
  input EN_A, input EN_B, input INJECT_DBITERR_A, input INJECT_DBITERR_B,
  input INJECT_SBITERR_A, input INJECT_SBITERR_B, input RDB_WR_A, input RDB_WR_B,
  input RST_A, input RST_B, input SLEEP
);
  reg [71:0] memory [0:4095];
  integer index;
  initial begin
    for (index = 0; index < 4096; index = index + 1) memory[index] = 72'd0;
    DOUT_A = 72'd0;
    DOUT_B = 72'd0;
  end

  function [71:0] written(input [71:0] old, input [71:0] data, input [8:0] bwe,
                          input interleaved);
    integer lane;
    begin
      written = old;
      for (lane = 0; lane < 8; lane = lane + 1)
        if (bwe[lane]) begin
          written[8 * lane +: 8] = data[8 * lane +: 8];
          if (interleaved) written[64 + lane] = data[64 + lane];
        end
      if (!interleaved && bwe[8]) written[71:64] = data[71:64];
    end
  endfunction

  always @(posedge CLK) begin
    if (RST_A) DOUT_A <= 72'd0;
    else if (EN_A && !RDB_WR_A) DOUT_A <= memory[ADDR_A[11:0]];
    if (EN_A && RDB_WR_A)
      memory[ADDR_A[11:0]] = written(memory[ADDR_A[11:0]], DIN_A, BWE_A,
                                     BWE_MODE_A == "PARITY_INTERLEAVED");
    if (RST_B) DOUT_B <= 72'd0;
    else if (EN_B && !RDB_WR_B) DOUT_B <= memory[ADDR_B[11:0]];
    if (EN_B && RDB_WR_B)
      memory[ADDR_B[11:0]] = written(memory[ADDR_B[11:0]], DIN_B, BWE_B,
                                     BWE_MODE_B == "PARITY_INTERLEAVED");
  end
endmodule
