#include "test-util.h"
int main(void){return 0;}
